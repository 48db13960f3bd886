"""`kilter prep --format llmc|nanogpt|megatron|npy` against files numpy writes (issue 14).

usage: import_check.py KILTER WORKDIR

Part 1: corpora written with numpy in each documented layout (llm.c .bin v1/v2 and LLaMA-3,
nanoGPT's flat uint16, Megatron-LM .idx/.bin, .npy v1 and v2 of several integer dtypes) are
imported, and the dataset read back with h5py must hold exactly the documents this script's own
splitter expects (split at the EOT id, EOTs not stored, empty documents dropped; Megatron also at
its document index), with the expected vocab_size, eos_id and tokenizer attributes.
Part 2: malformed files, one per kind of structural fault; each must be refused with exit code 1
and a message naming the file and the byte offset of the fault (never a crash).
"""
import glob
import os
import struct
import subprocess
import sys

import h5py
import numpy as np

KILTER, WORK = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(14)
checked = []


def run(*args):
    return subprocess.run([KILTER, "prep", *args, "--quiet"], capture_output=True, text=True, timeout=120)


def read_dataset(out):
    docs = []
    index = h5py.File(os.path.join(out, "index.h5"), "r")
    for shard in sorted(glob.glob(os.path.join(out, "shard-*.h5"))):
        with h5py.File(shard, "r") as f:
            tokens, offsets = f["tokens"][...], f["offsets"][...]
            docs += [tokens[offsets[i]:offsets[i + 1]].astype(np.int64).tolist() for i in range(len(offsets) - 1)]
    attrs = {k: index.attrs[k] for k in ("vocab_size", "eos_id", "tokenizer")}
    lengths = index["doc_lengths"][...].tolist()
    index.close()
    assert lengths == [len(d) for d in docs], f"{out}: index doc_lengths disagree with the shards"
    return docs, attrs


def split(stream, eot, boundaries=()):
    """The documents of a token stream: cut at every EOT (dropped) and after each boundary index."""
    docs, current = [], []
    cut_after = set(boundaries)
    for i, t in enumerate(stream):
        if t == eot:
            if current:
                docs.append(current)
            current = []
        else:
            current.append(int(t))
        if i in cut_after:
            if current:
                docs.append(current)
            current = []
    if current:
        docs.append(current)
    return docs


def import_and_compare(name, fmt, inputs, expected_docs, vocab, eos, extra=(), tokenizer=b"imported"):
    out = os.path.join(WORK, "out-" + name)
    r = run("--format", fmt, "--input", *inputs, "--out", out, *extra)
    assert r.returncode == 0, f"{name}: kilter prep failed: {r.stderr}"
    docs, attrs = read_dataset(out)
    assert docs == expected_docs, f"{name}: documents differ ({len(docs)} read, {len(expected_docs)} expected)"
    assert int(attrs["vocab_size"]) == vocab, f"{name}: vocab_size {attrs['vocab_size']}, expected {vocab}"
    assert int(attrs["eos_id"]) == eos, f"{name}: eos_id {attrs['eos_id']}, expected {eos}"
    tok = attrs["tokenizer"]
    tok = tok if isinstance(tok, bytes) else tok.encode()
    assert tok == tokenizer, f"{name}: tokenizer {tok}, expected {tokenizer}"
    v = subprocess.run([KILTER, "prep", "validate", out], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, f"{name}: prep validate: {v.stdout}"
    checked.append((name, len(docs), sum(map(len, docs))))


def random_docs(n, vocab, eot, min_len=1, max_len=60):
    docs = []
    for _ in range(n):
        d = rng.integers(0, vocab, size=int(rng.integers(min_len, max_len + 1)))
        d[d == eot] = (eot + 1) % vocab  # no EOT inside a document
        docs.append(d)
    return docs


def llmc_file(path, tokens, magic=20240520, version=1, count=None, dtype=np.uint16):
    header = np.zeros(256, dtype=np.int32)  # llm.c's write_datafile
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())


def megatron_files(prefix, docs_of_sequences, dtype=np.uint16, code=8, version=1, seq_count=None):
    """Megatron-LM's _IndexWriter layout; docs_of_sequences: list of documents, each a list of sequences."""
    sizes, pointers, doc_idx = [], [], [0]
    item = np.dtype(dtype).itemsize
    with open(prefix + ".bin", "wb") as b:
        for doc in docs_of_sequences:
            for seq in doc:
                pointers.append(b.tell())
                sizes.append(len(seq))
                b.write(np.asarray(seq, dtype=dtype).tobytes(order="C"))
            doc_idx.append(len(sizes))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", version))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes) if seq_count is None else seq_count))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))
    assert all(p == sum(sizes[:i]) * item for i, p in enumerate(pointers))


def part1():
    os.makedirs(WORK, exist_ok=True)
    eot = 50256
    # llm.c v1 (uint16): llm.c writes the EOT before every document; two files, a document
    # continuing from the first into the second.
    docs = random_docs(40, 50257, eot)
    stream = np.concatenate([np.concatenate([[eot], d]) for d in docs]).astype(np.uint16)
    cut = len(stream) // 2 + 3
    llmc_file(f"{WORK}/fw_000.bin", stream[:cut])
    llmc_file(f"{WORK}/fw_001.bin", stream[cut:])
    import_and_compare("llmc-v1", "llmc", [f"{WORK}/fw_000.bin", f"{WORK}/fw_001.bin"], split(stream, eot),
                       50257, eot, extra=("--vocab", "50257", "--shards", "3"))
    # llm.c v2 (uint32 tokens, ids above 65535), vocab inferred as max id + 1.
    docs = random_docs(20, 100000, eot)
    stream = np.concatenate([np.concatenate([[eot], d]) for d in docs]).astype(np.uint32)
    llmc_file(f"{WORK}/v2.bin", stream, version=2, dtype=np.uint32)
    import_and_compare("llmc-v2", "llmc", [f"{WORK}/v2.bin"], split(stream, eot), int(stream.max()) + 1, eot)
    # llm.c LLaMA-3 files: magic 20240801 version 7, uint32, documents start with 128000.
    bos = 128000
    docs = random_docs(15, 128256, bos)
    stream = np.concatenate([np.concatenate([[bos], d]) for d in docs]).astype(np.uint32)
    llmc_file(f"{WORK}/llama3.bin", stream, magic=20240801, version=7, dtype=np.uint32)
    import_and_compare("llmc-llama3", "llmc", [f"{WORK}/llama3.bin"], split(stream, bos), 128256, bos,
                       extra=("--vocab", "128256"))
    # nanoGPT's prepare.py: ids + [eot] per document, flat uint16 (np.memmap writes the same bytes).
    docs = random_docs(50, 50257, eot)
    stream = np.concatenate([np.concatenate([d, [eot]]) for d in docs]).astype(np.uint16)
    arr = np.memmap(f"{WORK}/train.bin", dtype=np.uint16, mode="w+", shape=(len(stream),))
    arr[:] = stream
    arr.flush()
    del arr
    import_and_compare("nanogpt", "nanogpt", [f"{WORK}/train.bin"], split(stream, eot), 50257, eot,
                       extra=("--shards", "2"))
    # .npy v1 int32 with a custom EOT and small vocab; consecutive EOTs give an empty document.
    stream = rng.integers(0, 500, size=3000).astype(np.int32)
    stream[[10, 11, 500, 2999]] = 7
    np.save(f"{WORK}/ids.npy", stream)
    import_and_compare("npy-int32", "npy", [f"{WORK}/ids.npy"], split(stream, 7), 500, 7,
                       extra=("--eot", "7", "--vocab", "500"))
    # .npy v2.0 header, uint16, and int64, uint8.
    stream16 = rng.integers(0, 1000, size=2000).astype(np.uint16)
    with open(f"{WORK}/v2.npy", "wb") as f:
        np.lib.format.write_array(f, stream16, version=(2, 0))
    import_and_compare("npy-v2-uint16", "npy", [f"{WORK}/v2.npy"], split(stream16, 3), 1000, 3,
                       extra=("--eot", "3", "--vocab", "1000"))
    stream64 = rng.integers(0, 70000, size=2000).astype(np.int64)
    np.save(f"{WORK}/ids64.npy", stream64)
    import_and_compare("npy-int64", "npy", [f"{WORK}/ids64.npy"], split(stream64, 5), int(stream64.max()) + 1, 5,
                       extra=("--eot", "5"))
    stream8 = rng.integers(0, 200, size=500).astype(np.uint8)
    np.save(f"{WORK}/ids8.npy", stream8)
    import_and_compare("npy-uint8", "npy", [f"{WORK}/ids8.npy"], split(stream8, 0), 256, 0,
                       extra=("--eot", "0", "--vocab", "256"))
    # Megatron-LM: documents of several sequences, an empty document, --append-eod style EOTs.
    eod = 2
    mdocs = []
    for i in range(30):
        seqs = [rng.integers(3, 32000, size=int(rng.integers(1, 40))).tolist() for _ in range(int(rng.integers(1, 4)))]
        if i % 3 == 0:
            seqs[-1].append(eod)
        mdocs.append(seqs)
    mdocs.insert(5, [])  # a document without sequences
    megatron_files(f"{WORK}/corpus_text_document", mdocs)
    expected = [d for d in ([t for s in doc for t in s if t != eod] for doc in mdocs) if d]
    import_and_compare("megatron-uint16", "megatron", [f"{WORK}/corpus_text_document"], expected, 32000, eod,
                       extra=("--eot", str(eod), "--vocab", "32000", "--shards", "2"))
    megatron_files(f"{WORK}/m32", mdocs, dtype=np.int32, code=4)
    import_and_compare("megatron-int32", "megatron", [f"{WORK}/m32.idx"], expected, 32000, eod,
                       extra=("--eot", str(eod), "--vocab", "32000"))
    # A byte-level llm.c file with the byte tokenizer attached: tokenizer "byte", eos 256.
    text = [b"Hello, world.", b"Second document here.", b"x"]
    stream = np.concatenate([np.concatenate([np.frombuffer(t, dtype=np.uint8), [256]]) for t in text]).astype(np.uint16)
    llmc_file(f"{WORK}/bytes.bin", stream)
    import_and_compare("llmc-byte-tokenizer", "llmc", [f"{WORK}/bytes.bin"], [list(t) for t in text], 257, 256,
                       extra=("--tokenizer", "byte"), tokenizer=b"byte")


def expect_refused(name, fmt, path, offset, needle, extra=()):
    out = os.path.join(WORK, "bad-" + name)
    r = run("--format", fmt, "--input", path, "--out", out, *extra)
    msg = r.stderr.strip()
    assert r.returncode == 1, f"{name}: exit code {r.returncode} (expected 1): {msg}"
    assert os.path.basename(path) in msg, f"{name}: the message does not name the file: {msg}"
    assert f"byte offset {offset}" in msg, f"{name}: the message does not give byte offset {offset}: {msg}"
    assert needle in msg, f"{name}: the message lacks '{needle}': {msg}"
    assert not os.path.exists(out), f"{name}: a dataset was written"
    checked.append(("refused: " + name, 0, 0))
    print(f"  {name}: {msg.splitlines()[-1][:150]}")


def part2():
    good = np.arange(100, dtype=np.uint16)
    # llm.c
    llmc_file(f"{WORK}/bad_magic.bin", good, magic=12345)
    expect_refused("llmc bad magic", "llmc", f"{WORK}/bad_magic.bin", 0, "bad magic")
    llmc_file(f"{WORK}/bad_version.bin", good, version=3)
    expect_refused("llmc unsupported version", "llmc", f"{WORK}/bad_version.bin", 4, "version 3")
    llmc_file(f"{WORK}/short.bin", good, count=1000)  # the header announces more than the file holds
    expect_refused("llmc count the file cannot hold", "llmc", f"{WORK}/short.bin", 1024 + 200, "truncated")
    llmc_file(f"{WORK}/long.bin", good, count=50)
    expect_refused("llmc trailing bytes", "llmc", f"{WORK}/long.bin", 1024 + 100, "unexpected bytes")
    with open(f"{WORK}/tiny.bin", "wb") as f:
        f.write(np.zeros(10, dtype=np.int32).tobytes())
    expect_refused("llmc truncated header", "llmc", f"{WORK}/tiny.bin", 40, "truncated")
    # nanoGPT
    with open(f"{WORK}/odd.bin", "wb") as f:
        f.write(good.tobytes() + b"\x01")
    expect_refused("nanogpt odd size", "nanogpt", f"{WORK}/odd.bin", 200, "truncated")
    # ids out of range and negative ids
    ids = np.arange(100, dtype=np.uint16)
    ids[37] = 5000
    with open(f"{WORK}/range.bin", "wb") as f:
        f.write(ids.tobytes())
    expect_refused("id out of range", "nanogpt", f"{WORK}/range.bin", 37 * 2, "out of range",
                   extra=("--vocab", "1000", "--eot", "0"))
    neg = np.arange(50, dtype=np.int32)
    neg[20] = -4
    np.save(f"{WORK}/neg.npy", neg)
    expect_refused("negative id", "npy", f"{WORK}/neg.npy", 128 + 20 * 4, "negative", extra=("--eot", "0"))
    # npy
    with open(f"{WORK}/notnpy.npy", "wb") as f:
        f.write(b"NOTNUMPY" + b"\x00" * 200)
    expect_refused("npy bad magic", "npy", f"{WORK}/notnpy.npy", 0, "bad magic")
    np.save(f"{WORK}/float.npy", np.arange(10, dtype=np.float32))
    expect_refused("npy float dtype", "npy", f"{WORK}/float.npy", 10, "unsupported npy dtype")
    np.save(f"{WORK}/be.npy", np.arange(10, dtype=">u2"))
    expect_refused("npy big-endian dtype", "npy", f"{WORK}/be.npy", 10, "big-endian")
    np.save(f"{WORK}/twod.npy", np.zeros((4, 5), dtype=np.int32))
    expect_refused("npy 2-D array", "npy", f"{WORK}/twod.npy", 10, "1-D")
    np.save(f"{WORK}/cut.npy", np.arange(1000, dtype=np.int32))
    with open(f"{WORK}/cut.npy", "r+b") as f:
        f.truncate(128 + 1000)
    expect_refused("npy truncated data", "npy", f"{WORK}/cut.npy", 128 + 1000, "truncated")
    header = b"{'descr': '<i4', 'fortran_order': False, 'shape': (10,) "  # no closing brace
    with open(f"{WORK}/badhdr.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x00" * 40)
    expect_refused("npy bad header", "npy", f"{WORK}/badhdr.npy", 10 + len(header), "bad npy header")
    header = b"{'descr': '<i4', 'shape': (10,), }"
    with open(f"{WORK}/nofortran.npy", "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + b"\x00" * 40)
    expect_refused("npy header without fortran_order", "npy", f"{WORK}/nofortran.npy", 10 + len(header) - 1,
                   "fortran_order")
    # Megatron
    docs = [[[5, 6, 7], [8, 9]], [[10, 11, 12]]]
    megatron_files(f"{WORK}/mbad", docs)
    with open(f"{WORK}/mbad.idx", "r+b") as f:
        f.write(b"MMIDIDY")
    expect_refused("megatron bad magic", "megatron", f"{WORK}/mbad.idx", 0, "bad magic")
    megatron_files(f"{WORK}/mfloat", docs, dtype=np.float32, code=6)
    expect_refused("megatron float dtype", "megatron", f"{WORK}/mfloat.idx", 17, "unsupported dtype code 6")
    megatron_files(f"{WORK}/mver", docs, version=2)
    expect_refused("megatron unsupported version", "megatron", f"{WORK}/mver.idx", 9, "version 2")
    megatron_files(f"{WORK}/mcount", docs, seq_count=10**15)
    expect_refused("megatron count the file cannot hold", "megatron", f"{WORK}/mcount.idx", 18, "sequences")
    megatron_files(f"{WORK}/mtrunc", docs)
    with open(f"{WORK}/mtrunc.bin", "r+b") as f:
        f.truncate(12)  # the third sequence (bytes 10..16) no longer fits
    expect_refused("megatron truncated .bin", "megatron", f"{WORK}/mtrunc.idx", 34 + 3 * 4 + 2 * 8, "truncated .bin")
    megatron_files(f"{WORK}/mdoc", docs)
    with open(f"{WORK}/mdoc.idx", "r+b") as f:  # doc_idx = [0, 2, 3] -> [0, 4, 3]
        f.seek(34 + 3 * 12 + 8)
        f.write(struct.pack("<q", 4))
    expect_refused("megatron document index out of order", "megatron", f"{WORK}/mdoc.idx", 34 + 36 + 8, "doc_idx[1]")


def option_errors():
    """Tokenizers that cannot be attached are refused by name, before anything is written."""
    good = f"{WORK}/fw_000.bin"
    with open(f"{WORK}/vocab.txt", "w") as f:
        f.write("not a tokenizer")
    cases = [
        (("--tokenizer", f"{WORK}/vocab.txt"), "vocab.txt"),
        (("--tokenizer", f"{WORK}/missing.model"), "missing.model"),
        (("--tokenizer", "byte", "--vocab", "100"), "smaller than the vocabulary of --tokenizer byte"),
        (("--eot", "70000", "--vocab", "60000"), "--eot 70000 is not below the vocabulary size 60000"),
    ]
    for extra, needle in cases:
        out = os.path.join(WORK, "bad-option")
        r = run("--format", "llmc", "--input", good, "--out", out, *extra)
        assert r.returncode == 1 and needle in r.stderr, f"{extra}: exit {r.returncode}: {r.stderr}"
        assert not os.path.exists(out), f"{extra}: a dataset was written"
        checked.append(("refused option: " + " ".join(extra), 0, 0))
        print(f"  {' '.join(extra)}: {r.stderr.strip().splitlines()[-1][:150]}")


if __name__ == "__main__":
    part1()
    print("import_check: imports equal numpy's documents:")
    for name, n_docs, n_tokens in checked:
        print(f"  {name}: {n_docs} documents, {n_tokens} tokens")
    part2()
    option_errors()
    refused = sum(1 for c in checked if c[0].startswith("refused: "))
    options = sum(1 for c in checked if c[0].startswith("refused option"))
    print(f"import_check: {len(checked) - refused - options} layouts imported exactly, {refused} malformed files "
          f"refused with file and byte offset, {options} bad options refused")
