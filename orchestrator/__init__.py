"""The orchestrator, one folder per job: ``run/`` (the Ray driver), ``plan/`` (what a profile costs, before
it runs; torch-free) and ``report/`` (tables, figures and claims from a run's traces); beside them what all
three read: ``profile/`` (the settings), ``grid.py`` and ``keys.py`` (the cells and their unit keys) and
``manifest.py`` (the record of units)."""
