"""algo"""
