"""Pure tensor functions: the mathematics of each mechanism, without parameters or modules."""
