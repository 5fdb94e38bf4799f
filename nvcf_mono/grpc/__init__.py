"""The one grpclib server of a host, assembled from the servicers plugins contribute; gRPC helpers both ends use."""

from nvcf_mono.grpc import h2_repr, uncancel

# Every process that speaks gRPC imports this package first.
h2_repr.install()
uncancel.install()
