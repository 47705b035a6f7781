"""driftstream.barriers"""
