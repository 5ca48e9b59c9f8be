"""Sizing and spreading a run: the memory plan (``memory``, ``plan``), which devices the learner and the
engine get (``placement``) and the Ray cluster (``ray_cluster``, imported only by a run with a ray
section). Imported by module; nothing is re-exported here."""
