"""Code the tests and the benchmarks share: the labelled TensorRT stand-in and the sample loader."""
