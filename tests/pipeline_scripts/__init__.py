"""Helpers of tests/test_pipeline.py: worker functions for process stages, subprocess scripts."""
