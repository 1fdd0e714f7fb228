"""The four vector indices (docs/design.md, "Embeddings, vector indices, synonyms"): float16 unit rows per index
(sparse rows when the vectors are mostly zeros, as the builtin embedder's are; else a dense matrix), searched
exactly, plus an HNSW graph only for a dense index of at least `vectors.exact_below` items.

API (the query stage codes against this):

    from hrag_cli.storage.vectors.index import VectorIndex, INDEX_NAMES   # ("chunks", "entities", "relations", "facts")
    idx = VectorIndex.load(project.vectors_dir, "chunks", settings.vectors)   # None when never built
    idx.model_id            # embedder model_id the vectors came from; compare with get_embedder(...).model_id
    idx.dim, len(idx), idx.ids (list[str], id order)
    ids, sims = idx.search(queries, k, ef=None)   # queries float32 (nq, dim) or (dim,); ids: list[list[str]] (nq lists,
                                         # each <= k, best first); sims: float32 (nq, k) cosine, -inf padded
    idx.vectors()           # (len, dim) unit rows in idx.ids order, float16 (memory-mapped after load)
    idx.scores(query)       # float32 (len,): exact cosine of one query with every row
    idx.position(id) -> int | None       # row of an id in idx.ids / idx.vectors()

Writers (the synonyms stage):

    idx = VectorIndex.load_or_create(vectors_dir, "chunks", settings.vectors, model_id, dim)
    todo = idx.missing(ids, hashes)          # positions whose (id, text hash) the index lacks: embed only those
    counts = idx.sync(ids, hashes, vectors_of_todo, rows=todo)   # or sync(ids, hashes, full_matrix)
    idx.save(project.vectors_dir)            # <name>.f16.npy or <name>.csr-*.npy (a posted sparse index: only
                                             # csr-indptr, its values in <name>.csc-*.npy), <name>.keys/koff/
                                             # korder.npy, <name>.hashes.npy (+ .labels.npy and <name>.hnsw:
                                             # large dense only), then <name>.ids.jsonl (its header alone);
                                             # a sparse index `insert` took rows into: <name>.patch.npz and
                                             # the id map alone, beside its untouched base (`RowPatch`)
    idx = VectorIndex.load(vectors_dir, "facts", settings.vectors, lazy_ids=True)     # an incremental run:
    idx.insert(ids, hashes, old_rows, before, vectors)   # rows inserted or made again, the rest kept in place

Why it is shaped this way:
- Building HNSW graphs dominates a build of a few thousand to tens of thousands of items per index, and at those
  sizes an exact scan per query takes milliseconds. So below `exact_below` items there is no graph at all; a dense
  index above it gets one (built on every core) because an exact scan of millions of dense rows is not cheap.
- The builtin embedder hashes a text's words and n-grams into 2048 buckets and fills a few dozen to a few hundred
  of them: stored as sparse rows (a one-byte column in its band + float16 value) a fact takes a few hundred bytes
  instead of 8 KB, and a scan costs in proportion to the values stored. A sparse index never gets a graph (it
  would hold every vector dense).
- A top-k search of a posted index (a fact search) sums only the postings that can reach its top k
  (`SparseRows.posting_top`: a Cauchy-Schwarz bound on the columns not yet summed), then sums its few candidates
  as a full scoring does, so it returns the same rows and scores to the last bit from a fraction of the sums.
- float16 halves the bytes on disk and in the page cache; cosines of unit vectors move by < 1e-3, far below the
  gaps between neighbours that matter. Rows are stored unit-length, so the product is the cosine. A query widens
  the values through their bits (`products`, the same float32 products): numpy's own cast goes one value at a
  time and would be much of a posting search.
- The index is its own embedding store: `missing` names the items whose (id, text hash) it does not hold, so a
  later run embeds only new or changed texts and copies the other rows (no separate cache file needed).
- The matrix is saved as .npy and memory-mapped at query time: a query process touches only the pages it reads.
- An incremental run (a few % new items) splices: `insert` copies the kept rows' values run by run (a posted
  index's postings column by column, renumbered) and puts the new ones in, with no Python object per row, so a
  small run reads and writes the indices' bytes once instead of parsing an id-map line per row and deriving,
  merging and re-posting every value (so the id map is its header alone).
- Saving goes through store.atomic_path for every file; the id map is written last and names the matrix rows and
  the hnsw file's size, so a crash between renames is detected at load and reported as "rebuild with hrag
  synonyms" instead of returning wrong ids. An index of a format before 6 raises the same error (and the
  synonyms stage, whose fingerprint includes FORMAT, rebuilds it on the next `hrag index`); a format 6 one reads
  as a base without a patch.
"""
