"""Stage a model once in the provider's object store, in the stack's region, so that the nodes
read it over the private path with their own identity (``lrc stage``)."""
