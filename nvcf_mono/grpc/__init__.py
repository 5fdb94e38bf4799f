"""The one grpclib server of a host, assembled from the servicers plugins contribute."""
