import onnx, numpy as np
from onnx import helper, TensorProto, numpy_helper
def conv(name, ci, co, hw, k, s, p):
    w = numpy_helper.from_array((np.random.randn(co, ci, k, k) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array((np.random.randn(co) * 0.1).astype(np.float32), "b")
    n1 = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[p]*4, strides=[s, s])
    n2 = helper.make_node("Relu", ["y"], ["z"])
    o = (hw + 2*p - k)//s + 1
    g = helper.make_graph([n1, n2], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ci, hw, hw])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, co, o, o])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, name + ".onnx")
    np.save(name + "_x.npy", np.random.randn(1, ci, hw, hw).astype(np.float32))
conv("first_s2", 3, 64, 224, 3, 2, 0); conv("r18_first", 3, 64, 224, 7, 2, 3); conv("c3_s1", 16, 64, 55, 3, 1, 1)
