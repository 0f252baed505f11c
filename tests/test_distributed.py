"""A REALM forward/backward step under MirroredStrategy over 2 logical CPU devices equals
the single-device step on the same global batch."""
import numpy as np
import tensorflow as tf

from realm_tf.modeling import factory, losses
from tests.realm_features import pretraining_features


def _loss(model, features):
  out = model(features, training=True)
  loss_sum, weight_sum = losses.masked_lm_marginal_loss(
      out["retrieval_logits"], out["token_log_probs"], features["masked_lm_weights"])
  return losses.global_mean(loss_sum, weight_sum)


def _dense(grads, variables):
  # Unused variables (e.g. BERT's pooler when pooling='cls') get None: count them as zero.
  return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
          for g, v in zip(grads, variables)]


def test_mirrored_step_matches_single_device(tiny_config, tokenizer, mirrored_strategy):
  features = pretraining_features(tokenizer, tiny_config)  # global batch of 2
  # Uneven masked-token counts across the two replicas exercise the global normaliser.
  assert features["masked_lm_weights"].numpy().sum(1).tolist() == [1.0, 2.0]

  single = factory.build_realm_pretrainer(tiny_config)
  with tf.GradientTape() as tape:
    single_loss = _loss(single, features)
  single_grads = _dense(tape.gradient(single_loss, single.trainable_variables),
                        single.trainable_variables)

  strategy = mirrored_strategy
  assert strategy.num_replicas_in_sync == 2
  with strategy.scope():
    mirrored = factory.build_realm_pretrainer(tiny_config)
    mirrored(features)
  for target, source in zip(mirrored.variables, single.variables):
    target.assign(source)

  def replica_features(context):
    i = context.replica_id_in_sync_group
    return {k: v[i:i + 1] for k, v in features.items()}

  distributed = strategy.experimental_distribute_values_from_function(replica_features)

  @tf.function
  def step(batch):
    def replica_step(replica_batch):
      with tf.GradientTape() as tape:
        loss = _loss(mirrored, replica_batch)
      grads = _dense(tape.gradient(loss, mirrored.trainable_variables),
                     mirrored.trainable_variables)
      context = tf.distribute.get_replica_context()
      return (context.all_reduce(tf.distribute.ReduceOp.SUM, loss),
              context.all_reduce(tf.distribute.ReduceOp.SUM, grads))
    return strategy.run(replica_step, args=(batch,))

  loss, grads = step(distributed)
  assert strategy.num_replicas_in_sync == 2
  local = strategy.experimental_local_results
  np.testing.assert_allclose(local(loss)[0].numpy(), single_loss.numpy(), rtol=1e-5)
  for var, got, want in zip(mirrored.trainable_variables, grads, single_grads):
    np.testing.assert_allclose(local(got)[0].numpy(), want.numpy(), rtol=1e-3, atol=1e-6,
                               err_msg=var.name)
  # The gradient really reaches both retriever towers.
  names = [v.name for v, g in zip(mirrored.trainable_variables, single_grads)
           if np.abs(g.numpy()).max() > 0]
  assert any("query_embedder" in n for n in names)
  assert any("document_embedder" in n for n in names)
