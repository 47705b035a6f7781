"""driftstream.ordering"""
