"""Sphinx extension: the environment every chapter's kernel starts with.

``OMP_WAIT_POLICY=PASSIVE`` (unless set otherwise): the transformer chapters train with two OpenMP
threads, and on a machine where another program keeps the second core busy, a thread that spins
while it waits for the other one made chapter 7 many times slower (``running.md`` has the
measurement). A passive thread yields its core instead. It changes no number (the thread count is
the same). OpenMP reads it when torch loads, so it must be in the kernel's environment before the
first ``import torch``: the kernels the build starts inherit this process's environment.
"""
import os


def setup(app):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
