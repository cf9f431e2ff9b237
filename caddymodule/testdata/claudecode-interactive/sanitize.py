#!/usr/bin/env python3
"""Turns captured Claude Code request bodies into this directory's fixtures.

sanitize.py CAPTURE_DIR SESSION LABELS.json: CAPTURE_DIR holds the bodies
(NNN.json) and log.jsonl (one line per request: seq, file, method, path,
headers, route); LABELS maps a seq to [kind, segment, step]. Every JSON
string longer than 80 characters is replaced by filler of the same length
drawn from a SHA-256 of the original (equal texts stay equal, different
ones differ), the device ID in metadata.user_id is zeroed, and the key
order is kept. Prints the requests.json entries."""
import hashlib, json, os, re, sys

WORDS = ("plan answer change check step review prompt repository test file write session error "
         "output run task list read cache result tool context value agent replica model build "
         "message search request").split()


def filler(s):
    n = len(s)
    out, i, ctr = [], 0, 0
    seed = hashlib.sha256(s.encode()).digest()
    while sum(len(w) + 1 for w in out) < n + 1:
        h = hashlib.sha256(seed + ctr.to_bytes(4, "big")).digest()
        for b in h:
            out.append(WORDS[b % len(WORDS)])
        ctr += 1
    t = " ".join(out)
    return t[:n]


def clean(v, key=None):
    if isinstance(v, dict):
        return {k: clean(x, k) for k, x in v.items()}
    if isinstance(v, list):
        return [clean(x, key) for x in v]
    if isinstance(v, str):
        if key == "user_id":
            return re.sub(r'"device_id":"[0-9a-f]+"', lambda m: '"device_id":"' + "0" * 64 + '"', v)
        if len(v) > 80:
            return filler(v)
    return v


def main():
    cap, sess, labels = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for line in open(os.path.join(cap, "log.jsonl")):
        r = json.loads(line)
        if not r["file"]:
            out.append({"file": "", "session": sess, "method": r["method"], "path": r["path"],
                        "kind": "probe", "segment": "", "step": "probe", "headers": r["headers"],
                        "live_route": r["route"].split("; ")[-1]})
            continue
        kind, seg, step = labels[str(r["seq"])]
        body = json.load(open(os.path.join(cap, r["file"])))
        name = "%s-%02d.json" % (sess, r["seq"])
        with open(os.path.join(here, name), "w") as f:
            json.dump(clean(body), f, ensure_ascii=False, separators=(",", ":"))
        out.append({"file": name, "session": sess, "method": r["method"], "path": r["path"],
                    "kind": kind, "segment": seg, "step": step, "headers": r["headers"],
                    "live_route": r["route"].split("; ")[-1]})
    json.dump(out, sys.stdout, indent=1)


main()
