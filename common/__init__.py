"""The bottom layer every room uses: storage URIs and the node fetch cache, atomic writes, the
machine cache directory, dtype names, the rules language of settings, and the verifier registry and
loader."""
