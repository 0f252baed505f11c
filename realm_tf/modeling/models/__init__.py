"""Task models: heads on top of the networks."""
from realm_tf.modeling.models.knowledge_augmented_encoder import KnowledgeAugmentedEncoder
from realm_tf.modeling.models.reader import Reader
from realm_tf.modeling.models.realm_pretrainer import RealmPretrainer
from realm_tf.modeling.models.retriever import Retriever

__all__ = ["KnowledgeAugmentedEncoder", "Reader", "RealmPretrainer", "Retriever"]
