"""Data shipped with healer (the XID catalog)."""
