"""Modules importable under runpod-python's names (``runpod.serverless.modules``).

Only :mod:`.rp_logger` is provided.
"""
