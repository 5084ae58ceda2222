"""`embedlab bench`: every measurement against a reference taken in the same run (`bench.suite`
runs them all), and the GPU paths' checks against their CPU-tested oracles (`bench.cuda_checks`)."""
