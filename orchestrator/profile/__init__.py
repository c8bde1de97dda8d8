"""Profiles: validated, frozen dataclasses loaded from experiments/profiles/*.yaml.

By concern: schema.py (the sections and each field's rule; the decoding settings are
decoding/config.py's), checks.py (what spans fields and sections), load.py (YAML, ``--set``,
the one-line refusals), batch.py (how a global batch splits over the workers), errors.py.
"""
from __future__ import annotations

from orchestrator.profile.batch import BatchPlan, batch_plan
from orchestrator.profile.errors import ProfileError
from orchestrator.profile.load import PROFILE_DIR, profile_dict, read_profile
from orchestrator.profile.schema import Profile

__all__ = ["PROFILE_DIR", "BatchPlan", "Profile", "ProfileError", "batch_plan", "profile_dict",
           "read_profile"]
