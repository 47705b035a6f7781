"""driftstream.snapshots"""
