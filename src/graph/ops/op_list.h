// Every op, one line each: ZR_OP(name) is the factory ops::make_<name>() (defined in the op's file) under the graph
// JSON's op name. The one line outside its own file that a new op adds (README: Adding an op). op_util.h includes
// it to declare the factories and registry.cc to list them: explicit, rather than static registrars in the op
// files, which a static library's link could drop. No include guard: included once per use, with ZR_OP defined.
ZR_OP(linear)
ZR_OP(matmul)
ZR_OP(add)
ZR_OP(mul)
ZR_OP(gelu)
ZR_OP(relu)
ZR_OP(silu)
ZR_OP(swiglu)
ZR_OP(geglu)
ZR_OP(scale)
ZR_OP(softcap)
ZR_OP(dropout)
ZR_OP(qk_norm)
ZR_OP(layernorm)
ZR_OP(rmsnorm)
ZR_OP(attention)
ZR_OP(rope)
ZR_OP(embedding)
ZR_OP(cross_entropy)
ZR_OP(mse)
