"""Drafter training: the settings (config.py), the data and its shards, each backbone's objective
(eagle2.py, eagle3.py, backbones.py), the runners and the loop."""
