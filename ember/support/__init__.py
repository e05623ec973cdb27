"""Leaf utilities shared by every layer: dtypes, symbolic dims, text buffers."""
