"""driftstream.examples"""
