"""The mutation check: plants each single-line bug of :mod:`tests.mutation.bugs` in a
scratch copy of the tree and demands that the tests fail (``python -m tests.mutation``)."""
