"""The demo's choice of articles: a neighbourhood of articles that mention each other."""
from realm_tf.demo.corpus import linked_neighbourhood


def _article(title, text):
  return {"title": title, "text": text}


# Links (title mentions, either way round): Veloria - Talmont, Veloria - Amsel,
# Talmont - Amsel, Quessa - Orrin. Zenda mentions nothing and nothing mentions it; "amsel"
# (lower case) and "Talmonts" are not mentions of Amsel and Talmont.
ARTICLES = [
    _article("Zenda", "Zenda is a word with amsel in it and Talmonts."),
    _article("Quessa", "Quessa is an island; Orrin sailed there."),
    _article("Talmont", "Talmont is the capital of Veloria."),
    _article("Orrin", "Orrin was a sailor."),
    _article("Veloria", "Veloria is a country on the Amsel."),
    _article("Amsel", "The Amsel flows through Talmont."),
]


def test_the_most_linked_article_starts_and_its_neighbours_follow():
  titles = [a["title"] for a in linked_neighbourhood(ARTICLES, 3)]
  # Talmont, Veloria and Amsel each have 2 links; Talmont comes first in the file. Then
  # Veloria and Amsel each have 1 link into {Talmont}: file order puts Veloria first.
  assert titles == ["Talmont", "Veloria", "Amsel"]


def test_an_exhausted_neighbourhood_starts_again_from_the_most_linked_left():
  titles = [a["title"] for a in linked_neighbourhood(ARTICLES, 5)]
  assert titles == ["Talmont", "Veloria", "Amsel", "Quessa", "Orrin"]


def test_all_articles_when_asked_for_as_many_or_more():
  assert linked_neighbourhood(ARTICLES, 6) == ARTICLES
  assert linked_neighbourhood(ARTICLES, 0) == ARTICLES
  assert linked_neighbourhood(ARTICLES, 60) == ARTICLES
