"""The experiment machinery: configurations, profiles, training, evaluation, the results cache, runners.

* :mod:`.configs` and :mod:`.profiles`: experiments as frozen dataclasses (validation lives here), and how much
  a build computes;
* :mod:`.training` (seeds come from :mod:`lengthgen_utils.core.seeding`, with the seed base ``$LENGTHGEN_SEED``) and :mod:`.evaluation`: one optimisation loop; accuracy by length and position;
* :mod:`.cache`: ``load_or_run``, keyed by everything a result depends on;
* :mod:`.results` and :mod:`.runners`: one result type for every ensemble run, and the functions that run an
  experiment through the cache;
* :mod:`.zoo`: every position encoding through the same tasks (chapter 9).
"""
