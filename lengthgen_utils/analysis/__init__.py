"""What is read off trained models: the offset kernel (spectrum first), probes, closed forms, rates.

``architecture.md`` draws every module.
"""
