"""The experiment machinery: configurations, profiles, the optimiser, training, evaluation, the results cache,
runners.

``architecture.md`` draws every module.
"""
