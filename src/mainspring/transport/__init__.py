"""Controller <-> worker channels: messages and codec, clock sync, ZeroMQ and in-process links."""
