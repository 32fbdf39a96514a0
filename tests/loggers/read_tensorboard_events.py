#!/usr/bin/python3
"""Reads TensorBoard event files on its own, to check what the C++ writer produced.

    read_tensorboard_events.py [--protoc PROTOC] EVENT_PROTO PATH

PATH is an event file, or a directory whose events.out.tfevents.* files are read in name order.
The message classes come from EVENT_PROTO through `protoc --python_out`, so the reader shares the
field numbers with the writer but none of its code. Every record's framing is checked (both
masked CRC-32Cs, with the crc32c module, and the lengths); every Event is parsed.

Prints one JSON line per record that has a file_version and one per scalar:
    {"file": ..., "record": i, "step": s, "wall_time": t, "file_version": "brain.Event:2"}
    {"file": ..., "record": i, "step": s, "wall_time": t, "tag": ..., "value": v}
A finite value is a number (the float32 exactly, widened to double); inf, -inf and nan are the
strings "inf", "-inf" and "nan" (JSON has no numbers for them).

Exits 1, with the file, record and offset on stderr, on a CRC mismatch, a truncated record, an
Event that does not parse, or a summary value without simple_value.
"""

import argparse
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import crc32c


class BadRecord(Exception):
    pass


def masked_crc32c(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def load_messages(proto_path, protoc):
    proto_dir, proto_name = os.path.split(os.path.abspath(proto_path))
    with tempfile.TemporaryDirectory(prefix="tb_reader_") as out_dir:
        try:
            result = subprocess.run(
                [protoc, "-I", proto_dir, "--python_out", out_dir, os.path.join(proto_dir, proto_name)],
                capture_output=True, text=True)
        except OSError as e:
            sys.exit(f"read_tensorboard_events: cannot run {protoc}: {e}")
        if result.returncode != 0:
            sys.exit(f"read_tensorboard_events: protoc failed on {proto_path}: {result.stderr.strip()}")
        sys.path.insert(0, out_dir)
        try:
            # Loaded into memory here, so the directory can go once this returns.
            return importlib.import_module(os.path.splitext(proto_name)[0] + "_pb2")
        finally:
            sys.path.remove(out_dir)


def records(data):
    """Yields (offset, payload) of each TFRecord in data, checking the framing."""
    offset = 0
    while offset < len(data):
        if len(data) - offset < 12:
            raise BadRecord(f"truncated record header at offset {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked_crc32c(header) != header_crc:
            raise BadRecord(f"length CRC mismatch at offset {offset}")
        end = offset + 12 + length + 4
        if end > len(data):
            raise BadRecord(f"truncated record at offset {offset}: {length} bytes announced, "
                            f"{len(data) - offset - 16} present")
        payload = data[offset + 12:offset + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc32c(payload) != data_crc:
            raise BadRecord(f"data CRC mismatch in the record at offset {offset}")
        yield offset, payload
        offset = end


def json_value(v):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def read_file(path, messages, out):
    with open(path, "rb") as f:
        data = f.read()
    try:
        for index, (offset, payload) in enumerate(records(data)):
            event = messages.Event()
            try:
                event.ParseFromString(payload)
            except Exception as e:  # DecodeError, or a UnicodeDecodeError for a bad tag
                raise BadRecord(f"the Event at offset {offset} does not parse: {e}")
            base = {"file": os.path.basename(path), "record": index,
                    "step": event.step, "wall_time": event.wall_time}
            kind = event.WhichOneof("what")
            if kind == "file_version":
                out.append(dict(base, file_version=event.file_version))
            elif kind == "summary":
                for value in event.summary.value:
                    # ListFields() holds what was on the wire, whether or not the .proto gives
                    # simple_value presence (a plain proto3 float drops 0.0).
                    if "simple_value" not in (f.name for f, _ in value.ListFields()):
                        raise BadRecord(f"summary value {value.tag!r} at offset {offset} has no simple_value")
                    out.append(dict(base, tag=value.tag, value=json_value(value.simple_value)))
            else:
                raise BadRecord(f"the Event at offset {offset} has neither file_version nor summary")
    except BadRecord as e:
        raise BadRecord(f"{path}: {e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protoc", default="protoc")
    parser.add_argument("proto")
    parser.add_argument("path")
    args = parser.parse_args()

    messages = load_messages(args.proto, args.protoc)
    if os.path.isdir(args.path):
        files = sorted(os.path.join(args.path, n) for n in os.listdir(args.path)
                       if n.startswith("events.out.tfevents."))
        if not files:
            sys.exit(f"read_tensorboard_events: no events.out.tfevents.* file in {args.path}")
    else:
        files = [args.path]

    out = []
    try:
        for path in files:
            read_file(path, messages, out)
    except BadRecord as e:
        sys.exit(f"read_tensorboard_events: {e}")
    for line in out:
        print(json.dumps(line, ensure_ascii=False, allow_nan=False))


if __name__ == "__main__":
    main()
