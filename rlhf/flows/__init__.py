"""Prefect flows that chain the pipeline stages."""
