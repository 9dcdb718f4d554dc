"""The book's model code: tasks, position encodings, RoPE's numerics, attention, and the models.

``architecture.md`` draws every module.
"""
