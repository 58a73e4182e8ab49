#!/usr/bin/env python3
"""A soak of inferd under mixed traffic for a bounded time, over raw keep-alive connections on loopback:

  good       closed-loop clients posting valid digits rows; each must be answered 200 (or shed cleanly: 429/503
             with Retry-After). Anything else, a reset or a connection closed before the answer, is a lost request.
  malformed  bodies that are not JSON, wrong shapes, wrong types, unknown models: each must be a 4xx.
  aborted    connections closed half-way through a request head or body.
  slow       a 4,096-row request whose 400 KB answer is read a few KB at a time, or abandoned half-read.
  gzip       a 200 KB gzip body that inflates past --max-rows: each must be a 413.
  probes     /health/live every 100 ms: each must be 200.

At the end: RSS before (after warm-up), its peak, and after a pause; the process must come back near where it
started and lose no request. Prints a table, writes it as JSON, exits 1 on any failure. Standard library only.

  python3 benches/soak.py --pid PID --address 127.0.0.1:8080 --duration 120 [--out benches/results/soak.json]
"""

import argparse
import asyncio
import gzip
import json
import os
import random
import sys
import time

GOOD_CLIENTS, MALFORMED_CLIENTS, ABORTED_CLIENTS, SLOW_CLIENTS, GZIP_CLIENTS = 16, 4, 4, 2, 2


def rss(pid, field):
    """A /proc/PID/status field (VmRSS, VmHWM) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for {pid}")


def request(path, body=b"", method="POST", headers=()):
    head = [f"{method} {path} HTTP/1.1", "Host: inferd", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def read_response(reader, slow=False):
    """Status, headers and body of one response; `slow` reads the body 4 KB at a time with pauses."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
    length = int(headers.get("content-length", "0"))
    body = b""
    while len(body) < length:
        chunk = await reader.read(min(4096, length - len(body)) if slow else length - len(body))
        if not chunk:
            raise ConnectionError("closed before the end of the answer")
        body += chunk
        if slow:
            await asyncio.sleep(0.01)
    return status, headers, body


class Tally:
    def __init__(self):
        self.counts = {}
        self.failures = []

    def count(self, kind, outcome):
        key = f"{kind}: {outcome}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, kind, what):
        self.count(kind, "FAILED")
        if len(self.failures) < 20:
            self.failures.append(f"{kind}: {what}")


async def good(host, port, until, tally, row):
    body = json.dumps({"input": [row]}).encode()
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            tally.fail("good", f"connect: {e}")
            return
        try:
            while time.monotonic() < until:
                writer.write(request("/models/digits/predict", body))
                await writer.drain()
                status, headers, answer = await read_response(reader)
                if status == 200:
                    tally.count("good", "200")
                elif status in (429, 503) and headers.get("retry-after"):
                    tally.count("good", f"{status} shed")
                else:
                    tally.fail("good", f"status {status}: {answer[:120]!r}")
                if headers.get("connection") == "close":
                    break
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
            tally.fail("good", f"lost: {type(e).__name__}: {e}")
        finally:
            writer.close()


MALFORMED = [
    (b"not json at all", 400),
    (b'{"input": [[1, 2, 3]]}', 400),
    (b'{"input": [["a", "b"]]}', 400),
    (b'{"input": ' + b"[" * 200 + b"]" * 200 + b"}", 400),
    (b'{"inputs": {"nope": [[1]]}}', 400),
    (b"{" * 5, 400),
]


async def malformed(host, port, until, tally):
    rng = random.Random(3)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.monotonic() < until:
            body, want = rng.choice(MALFORMED)
            path = "/models/digits/predict" if rng.random() < 0.9 else "/models/no-such-model/predict"
            writer.write(request(path, body))
            await writer.drain()
            status, headers, _ = await read_response(reader)
            if 400 <= status < 500:
                tally.count("malformed", str(status))
            else:
                tally.fail("malformed", f"status {status} for {body[:40]!r}")
            if headers.get("connection") == "close":
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
        tally.fail("malformed", f"{type(e).__name__}: {e}")
    finally:
        writer.close()


async def aborted(host, port, until, tally, row):
    rng = random.Random(5)
    full = request("/models/digits/predict", json.dumps({"input": [row] * 8}).encode())
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(full[: rng.randrange(1, len(full) - 1)])
            await writer.drain()
            await asyncio.sleep(rng.random() * 0.05)
            writer.transport.abort()
            tally.count("aborted", "sent part, closed")
        except OSError as e:
            tally.fail("aborted", f"connect: {e}")
            return


async def slow(host, port, until, tally, row):
    body = json.dumps({"input": [row] * 4096}).encode()
    rng = random.Random(7)
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request("/models/digits/predict", body))
            await writer.drain()
            if rng.random() < 0.5:
                status, _, answer = await read_response(reader, slow=True)
                if status == 200:
                    tally.count("slow", "read in full")
                elif status in (429, 503):
                    tally.count("slow", f"{status} shed")
                else:
                    tally.fail("slow", f"status {status}: {answer[:120]!r}")
            else:
                await reader.read(20000)
                tally.count("slow", "abandoned half-read")
            writer.transport.abort()
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
            tally.fail("slow", f"{type(e).__name__}: {e}")


async def oversize_gzip(host, port, until, tally, bomb):
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request("/models/digits/predict", bomb, headers=("Content-Encoding: gzip",)))
            await writer.drain()
            status, _, answer = await read_response(reader)
            if status == 413:
                tally.count("gzip", "413")
            else:
                tally.fail("gzip", f"status {status}: {answer[:120]!r}")
            writer.close()
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
            tally.fail("gzip", f"{type(e).__name__}: {e}")
        await asyncio.sleep(0.2)


async def probes(host, port, until, tally):
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request("/health/live", method="GET"))
            await writer.drain()
            status, _, _ = await read_response(reader)
            tally.count("probe", str(status)) if status == 200 else tally.fail("probe", f"status {status}")
            writer.close()
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as e:
            tally.fail("probe", f"{type(e).__name__}: {e}")
        await asyncio.sleep(0.1)


def gzip_bomb(max_rows):
    row = "[" + ",".join(["0"] * 64) + "]"
    text = '{"input": [' + ",".join([row] * (max_rows * 4)) + "]}"
    return gzip.compress(text.encode(), 9)


async def soak(args):
    host, port = args.address.rsplit(":", 1)
    port = int(port)
    row = [float(i % 17) for i in range(64)]
    bomb = gzip_bomb(args.max_rows)
    tally = Tally()
    # Warm-up, then the baseline.
    await good(host, port, time.monotonic() + 2, Tally(), row)
    await asyncio.sleep(1)
    before = rss(args.pid, "VmRSS")
    started = time.monotonic()
    until = started + args.duration
    tasks = [good(host, port, until, tally, row) for _ in range(GOOD_CLIENTS)]
    tasks += [malformed(host, port, until, tally) for _ in range(MALFORMED_CLIENTS)]
    tasks += [aborted(host, port, until, tally, row) for _ in range(ABORTED_CLIENTS)]
    tasks += [slow(host, port, until, tally, row) for _ in range(SLOW_CLIENTS)]
    tasks += [oversize_gzip(host, port, until, tally, bomb) for _ in range(GZIP_CLIENTS)]
    tasks.append(probes(host, port, until, tally))
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - started
    peak = rss(args.pid, "VmHWM")
    await asyncio.sleep(args.settle)
    after = rss(args.pid, "VmRSS")
    return tally, before, peak, after, elapsed, len(bomb)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True, help="the inferd process")
    parser.add_argument("--address", default="127.0.0.1:8080")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of mixed traffic")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of quiet before RSS is read again")
    parser.add_argument("--max-rows", type=int, default=4096, help="the server's --max-rows")
    parser.add_argument("--rss-slack-mib", type=float, default=48.0, help="how far RSS may stay above its baseline")
    parser.add_argument("--out", help="where to write the figures as JSON")
    args = parser.parse_args()
    tally, before, peak, after, elapsed, bomb = asyncio.run(soak(args))
    total = sum(tally.counts.values())
    print(f"soak: {elapsed:.0f} s, {total} requests and connections, gzip body {bomb / 1024:.0f} KB")
    for key in sorted(tally.counts):
        print(f"  {key:32s} {tally.counts[key]:>9}")
    print(f"  RSS MiB: before {before:.1f}, peak {peak:.1f}, after {after:.1f} (+{after - before:.1f})")
    for failure in tally.failures:
        print(f"  FAILED {failure}")
    ok = not tally.failures and after <= before + args.rss_slack_mib
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"seconds": elapsed, "counts": tally.counts, "failures": tally.failures,
                       "rss_mib": {"before": before, "peak": peak, "after": after}, "ok": ok}, f, indent=1)
    print("soak: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
