"""Tools beside the book: the command line, the benchmark, the build timer and the robustness run."""
