"""gyre_proxy"""
