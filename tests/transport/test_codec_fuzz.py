"""The worker channel's codec: any frames decode to a message or raise ``CodecError`` (which the
receiver logs and drops), never another exception that would stop a worker's loop."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mainspring.protocol import Infer
from mainspring.transport.messages import Act, CodecError, Ping, decode, encode, metas_of


def valid_act_frames() -> list[bytes]:
    samples = [{"x": np.arange(6, dtype=np.float32).reshape(1, 6)}, {"x": np.ones((1, 6), dtype=np.float32)}]
    action = Infer(action_id=7, device=0, model="mlp", earliest_ns=1, latest_ns=2, expected_duration_ns=1,
                   request_ids=(1, 2), batch_size=2)  # fmt: skip
    return [bytes(frame) for frame in encode(Act(action, metas_of(samples)), samples)]


def decodes_or_refuses(frames: list[bytes]) -> None:
    try:
        _, samples = decode(frames)
    except CodecError as error:
        refusal = str(error)
    else:
        refusal = ""
    if refusal:
        assert refusal.startswith("malformed message")
        return
    if samples is not None:
        assert all(isinstance(array, np.ndarray) for sample in samples for array in sample.values())


@settings(max_examples=300, deadline=None)
@given(frames=st.lists(st.binary(max_size=80), max_size=4))
def test_random_frames(frames: list[bytes]) -> None:
    decodes_or_refuses(frames)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_valid_message_with_bytes_changed_or_frames_dropped(data: st.DataObject) -> None:
    frames = valid_act_frames()
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    for _ in range(data.draw(st.integers(1, 4))):
        if frame:
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    frames[index] = bytes(frame)
    frames = frames[: data.draw(st.integers(0, len(frames)))]
    decodes_or_refuses(frames)


def test_valid_messages_round_trip() -> None:
    message, samples = decode(valid_act_frames())
    assert isinstance(message, Act) and samples is not None and samples[1]["x"].sum() == 6
    assert decode(encode(Ping(5)))[0] == Ping(5)
