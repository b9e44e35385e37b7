// The ops of _gradex_tf_ops.so. All are stateful (they communicate: never constant-folded, pruned
// only when unused, never merged by common-subexpression elimination) and name their engine by slot
// (slots.h). Tensors are matched across ranks by key, never by graph position.
//
//   GradexExchange(tensors: T) -> averaged: T      keys[i] names tensors[i]; one engine policy each
//                                                  (DGC / fp16 / dense); parameters=true averages
//                                                  parameters (LocalSGD) instead of gradients
//   GradexBroadcast(tensor: T) -> output: T        root_rank's value on every rank, bit for bit
//   GradexEndStep() -> average_now: bool           ends the engine's step (gradex_end_step)
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

using tensorflow::shape_inference::InferenceContext;

REGISTER_OP("GradexExchange")
    .Input("tensors: T")
    .Output("averaged: T")
    .Attr("T: list({float, half, bfloat16}) >= 1")
    .Attr("keys: list(string)")
    .Attr("engine: int")
    .Attr("parameters: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i)
        c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc("Averages each tensor over the ranks through the gradex engine bound to slot `engine`.");

REGISTER_OP("GradexBroadcast")
    .Input("tensor: T")
    .Output("output: T")
    .Attr(
        "T: {float, half, bfloat16, double, int8, uint8, int16, uint16, int32, uint32, int64, "
        "uint64, bool}")
    .Attr("key: string")
    .Attr("root_rank: int")
    .Attr("engine: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc("root_rank's tensor on every rank, exchanged under `key` (any dtype, bit-exact).");

REGISTER_OP("GradexEndStep")
    .Output("average_now: bool")
    .Attr("engine: int")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Ends a training step of the engine; true when LocalSGD says to average parameters now.");

#include "slots.h"

// GRADEX_TF_VERSION: tf.__version__ at configure time (CMakeLists.txt).
const char* gradex_tf_built_for(void) {
  return GRADEX_TF_VERSION;
}
