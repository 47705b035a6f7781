"""The keyed step's micro-benchmark measures what it says: the index's arrivals from two
files make late elements, the C and the Python run the same step to the same outputs."""

from driftstream.examples.benchmarks.keyed_step import arrivals, keyed_step


def test_two_files_read_in_turns_make_late_elements_and_both_paths_agree():
    c, python = keyed_step(docs=300, files=2, rounds=1), keyed_step(docs=300, files=2, rounds=1, python=True)
    assert c["records"] == python["records"] > 10_000
    assert c["late"] == python["late"] > 0 and c["outputs"] == python["outputs"] > c["records"]  # repairs replace outputs
    assert all(v > 0 for v in c["us_per_record"].values())


def test_one_file_arrives_in_order():
    reads = arrivals([{"page_id": i, "text": f"w{i % 3} common"} for i in range(600)], files=1)
    metas = [m for items, _ in reads for m, _, _ in items]
    assert metas == sorted(metas) and len(reads) == 3
    assert [w for _, w in reads] == sorted(w for _, w in reads)  # the watermark never goes back
    assert keyed_step.__defaults__[1] == 2
