"""Private implementation of :mod:`fitbatch.pipeline`; import the public names from there."""
