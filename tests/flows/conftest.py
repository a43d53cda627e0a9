"""The flow tests' Prefect API is the session fixture ``prefect_harness`` of tests/conftest.py
(shared with tests/load, so one session starts one API)."""
