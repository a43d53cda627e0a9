"""The one input contract of every probe and protocol: what ``fit`` and a protocol's run
accept, checked before any work, each refusal one line naming the value and what is valid."""
