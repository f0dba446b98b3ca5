"""The KServe v2 / Open Inference Protocol: one data plane, HTTP and gRPC only translate."""
