"""Read: classify provider refusals."""
