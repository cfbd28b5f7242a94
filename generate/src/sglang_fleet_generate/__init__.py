"""Resumable batch generation through a router or a server (``sglang-fleet generate``,
or ``sglang-fleet-generate generate`` without the deploy: cli.py).

    sglang-fleet generate prompts.jsonl s3://bucket/run-1/ --url http://10.0.0.10:30080 \\
        --api-key-file ~/.sglang-key

The input is streamed; the output is JSONL shards, each written once and atomically, plus
``manifest.json``. A shard on the output is the commit point: a rerun of the same command skips
every finished shard, so no id is written twice and none is lost across a kill -9.
"""
