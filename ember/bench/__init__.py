"""``ember bench``: ember and its peers on the model zoo, one process, interleaved."""
