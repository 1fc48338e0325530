"""The S3 backend of :class:`~k3artifacts.stores.base.Store`: ``s3://bucket/prefix``.

Same key layout as the file store, under ``prefix``. What S3 gives us instead of rename:

* **Visibility**: a revision's objects are uploaded first and its ``.k3a/manifest.json`` last
  (conditional put: never overwritten); readers treat a revision without it as absent.
* **Integrity**: every object carries a CRC64NVME *full-object* checksum that we compute from
  the quarantine file in the same pass that re-checks its sha256 against the verified record,
  and hand to S3 with the upload. S3 verifies the bytes it received against it (a multipart
  upload with a full-object checksum is rejected with BadDigest if any byte differs), so the
  chain is: upstream sha256 == record == local bytes == CRC S3 checked. After the upload we read
  back what S3 stored (HEAD with ChecksumMode) and compare it with ours, because some S3
  implementations (moto among them) verify nothing. Why CRC64NVME and not SHA-256:
  docs/guides/s3-and-fsx.md, "Checksums". Our sha256 and xxh3-128
  ride along as object metadata (``x-amz-meta-k3a-sha256``, ``x-amz-meta-k3a-xxh3-128``).
* **Streaming**: a shard at or above the multipart threshold is sent by this package in parts
  (:class:`_PartUpload`) while it is still downloading into quarantine, each part one ``pread``
  of bytes still in the page cache; the upload is completed only after the shard is verified
  and only if the CRCs of the parts sent combine to the CRC of the verified bytes. Smaller
  files go in one PUT after verification (s3transfer).
* **Reuse**: a file staging planned to take from a published revision of the same repo
  (:meth:`S3RevisionWriter.reuse`) is not copied at all: the new revision's object records
  (``.k3a/s3-objects.json``) name the object and version the source's records name, after a
  HEAD holds it to the file's size, sha256 and the CRC64NVME S3 checked at its upload. Readers
  follow the records; :meth:`S3Store.materialize` copies the objects into the prefix (s3transfer
  ``copy``: UploadPartCopy parts in parallel, past 5 GiB too) where a server reads the prefix
  itself; :meth:`S3Store.delete_revision` keeps every object some revision's records name
  (docs/architecture.md, "A new commit costs what it changed").
* **Resume**: an object already at its key with the record's sha256 and size is kept, so a

Modules, each importing only those below it:

* :mod:`.store`: :class:`S3Store`, revisions over the records (object records, references,
  materialization, repair, retirement);
* :mod:`.writer`: the revision writer and the streamed multipart puts;
  :mod:`.ranges`: ranged reads at recorded versions;
* :mod:`.records`: create-once records and compare-and-swap pointers (conditional writes);
* :mod:`.bucket`: keys, HEAD/GET, listings, deletes, multipart cleanup, transfer clients;
* :mod:`.objects`: metadata keys, checksums, receipts; :mod:`.transfers`: tuning, counters,
  progress.

Outside code imports the names below from ``k3artifacts.stores.s3``.
"""

from k3artifacts.stores.s3.objects import META_SHA256, META_XXH3, crc64nvme_and_sha256
from k3artifacts.stores.s3.store import S3Store
from k3artifacts.stores.s3.transfers import MiB, TransferTuning
from k3artifacts.stores.s3.writer import STREAM_LAG

__all__ = ["META_SHA256", "META_XXH3", "STREAM_LAG", "MiB", "S3Store", "TransferTuning",
           "crc64nvme_and_sha256"]
