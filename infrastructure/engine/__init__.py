"""The use cases behind the Engine facade, composed over one aggregate store."""
