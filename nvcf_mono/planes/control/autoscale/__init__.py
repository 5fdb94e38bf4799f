"""The autoscaler: NVCF's decision algorithm fed by measurements the platform takes itself."""
