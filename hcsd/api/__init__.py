"""The local gRPC API on hcsd's unix socket: messages, server and client."""
