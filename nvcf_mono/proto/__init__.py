"""Protocol buffer sources (``*.proto``) and the betterproto code generated from them (``gen/``)."""
