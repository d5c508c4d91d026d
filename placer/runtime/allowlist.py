"""The op types a measurement worker runs without `--allow-unsafe-ops` (reviewed by family, with the reason).

A worker executes graphs that clients send it. A TensorFlow graph is a program: some op types read or write
files (`ReadFile`, `WriteFile`, `SaveV2`, readers, summary writers, `PrintV2` with a file stream, `DebugIdentity`
with a `file://` URL, `ImmutableConst` which maps a file), call back into Python (`PyFunc`, `EagerPyFunc`), talk
to other processes or hosts (`Send`/`Recv` rendezvous, `RemoteCall`, `Rpc*`, collectives), or run opaque
pipelines that can do any of that (`*Dataset`, iterators). Those are refused. What is allowed is the set below:
ops that only compute on tensors held in memory, hold state in memory (variables, queues, tensor arrays,
tables filled from tensors), or route control flow. The check covers every node of the graph AND every node of
every function in its function library (bodies of `While`/`If`/`PartitionedCall` and friends), and a node
whose type is a library function name is allowed because that function's body is checked.

What the allowlist does NOT protect against: a graph that exhausts memory or CPU (the worker's per-measurement
timeout and process isolation handle those), and bugs in TensorFlow kernels themselves. Run workers only for
clients you trust with a token, on machines that hold nothing secret.

Families and why they are safe
- ARITHMETIC: element-wise math, reductions, comparisons, casts, linear algebra, FFTs — pure functions of
  their input tensors.
- NN: convolutions, pooling, normalisation, activations, losses and their gradients — pure tensor kernels.
- ARRAY: shape/layout ops (reshape, slice, concat, gather/scatter on tensors, pad, tile, ...) — pure.
- CONTROL_FLOW: TF1 loop/cond primitives and functional control flow (`While`, `If`, `Case`,
  `PartitionedCall`); they run functions from the graph's own library, which is checked too.
- CONSTANTS_AND_FEEDS: constants, placeholders, identity/no-op/gradient markers.
- STATE: variables (ref and resource), assignment and in-graph optimizer updates — state lives in the
  session's memory and dies with it.
- RANDOM: random number generation (stateless and stateful generators held in memory).
- CONTAINERS: in-memory queues, stacks, tensor arrays/lists/maps, staging areas, barriers, hash tables
  filled from tensors (not `InitializeTableFromTextFile`), accumulators.
- STRINGS_SPARSE: string manipulation, sparse tensors, example parsing from tensors (no file access).
- IMAGE: image decode/encode/resize on tensors in memory (no file access: decoding takes bytes tensors).
- CHECKS: `Assert`, `CheckNumerics` raise errors only (they write nothing).
"""
from __future__ import annotations

from dataclasses import dataclass

from placer.errors import PlacerError

_ARITHMETIC = """
Abs AccumulateNV2 Acos Acosh Add AddN AddV2 All Angle Any ApproximateEqual ArgMax ArgMin Asin Asinh Atan Atan2
Atanh BatchMatMul BatchMatMulV2 BatchMatMulV3 Betainc Bincount Bitcast BitwiseAnd BitwiseOr BitwiseXor Bucketize
Cast Ceil Cholesky CholeskyGrad ClipByValue Complex ComplexAbs Conj ConjugateTranspose Cos Cosh Cross Cumprod
Cumsum CumulativeLogsumexp DenseBincount Digamma Div DivNoNan Einsum Equal Erf Erfc Erfinv EuclideanNorm Exp
Expm1 FFT FFT2D FFT3D FFTND Floor FloorDiv FloorMod Greater GreaterEqual HistogramFixedWidth IFFT IFFT2D IFFT3D
IFFTND IRFFT IRFFT2D IRFFT3D IRFFTND Igamma IgammaGradA Igammac Imag Inv InvGrad Invert IsFinite IsInf IsNan
LeftShift Less LessEqual Lgamma LinSpace Log Log1p LogMatrixDeterminant LogicalAnd LogicalNot LogicalOr Lu
MatMul MatrixBandPart MatrixDeterminant MatrixExponential MatrixInverse MatrixLogarithm MatrixSolve
MatrixSolveLs MatrixSquareRoot MatrixTriangularSolve BandedTriangularSolve Max Maximum Mean Min Minimum Mod Mul
MulNoNan Ndtri Neg NextAfter NotEqual Polygamma PopulationCount Pow Prod Qr RFFT RFFT2D RFFT3D RFFTND Range Real
RealDiv Reciprocal ReciprocalGrad RightShift Rint Round Rsqrt RsqrtGrad SegmentMax SegmentMaxV2 SegmentMean
SegmentMin SegmentMinV2 SegmentProd SegmentProdV2 SegmentSum SegmentSumV2 Select SelectV2 SelfAdjointEig
SelfAdjointEigV2 Sigmoid SigmoidGrad Sign Sin Sinh SparseMatMul Sqrt SqrtGrad Square SquaredDifference Sub Sum
Svd Tan Tanh TanhGrad TridiagonalMatMul TridiagonalSolve TruncateDiv TruncateMod UnsortedSegmentMax
UnsortedSegmentMin UnsortedSegmentProd UnsortedSegmentSum Xdivy Xlog1py Xlogy Zeta BesselI0e BesselI1e
BesselI0 BesselI1 Dawsn Expint FresnelCos FresnelSin Spence BesselJ0 BesselJ1 BesselK0 BesselK0e BesselK1
BesselK1e BesselY0 BesselY1 Eig MatrixDiag MatrixDiagPart MatrixDiagPartV2 MatrixDiagPartV3 MatrixDiagV2
MatrixDiagV3 MatrixSetDiag MatrixSetDiagV2 MatrixSetDiagV3 BatchMatrixBandPart BatchMatrixDiag
BatchMatrixDiagPart BatchMatrixSetDiag BatchMatrixInverse BatchMatrixDeterminant BatchMatrixSolve
BatchMatrixTriangularSolve BatchCholesky InTopK InTopKV2 TopK TopKV2 NthElement ApproxTopK LowerBound UpperBound
Unique UniqueV2 UniqueWithCounts UniqueWithCountsV2 ListDiff SetSize DenseToDenseSetOperation
"""

_NN = """
AvgPool AvgPool3D AvgPool3DGrad AvgPoolGrad BatchNormWithGlobalNormalization BatchNormWithGlobalNormalizationGrad
BiasAdd BiasAddGrad BiasAddV1 BlockLSTM BlockLSTMGrad BlockLSTMGradV2 BlockLSTMV2 CTCLoss CTCLossV2
CTCGreedyDecoder CTCBeamSearchDecoder Conv Conv2D Conv2DBackpropFilter Conv2DBackpropFilterV2
Conv2DBackpropInput Conv2DBackpropInputV2 Conv3D Conv3DBackpropFilter Conv3DBackpropFilterV2 Conv3DBackpropInput
Conv3DBackpropInputV2 DataFormatDimMap DataFormatVecPermute DepthwiseConv2dNative
DepthwiseConv2dNativeBackpropFilter DepthwiseConv2dNativeBackpropInput Dilation2D Dilation2DBackpropFilter
Dilation2DBackpropInput Elu EluGrad FractionalAvgPool FractionalAvgPoolGrad FractionalMaxPool
FractionalMaxPoolGrad FusedBatchNorm FusedBatchNormGrad FusedBatchNormGradV2 FusedBatchNormGradV3
FusedBatchNormV2 FusedBatchNormV3 FusedPadConv2D FusedResizeAndPadConv2D GRUBlockCell GRUBlockCellGrad L2Loss
LRN LRNGrad LSTMBlockCell LSTMBlockCellGrad LeakyRelu LeakyReluGrad LogSoftmax MaxPool MaxPool3D MaxPool3DGrad
MaxPool3DGradGrad MaxPoolGrad MaxPoolGradGrad MaxPoolGradGradV2 MaxPoolGradGradWithArgmax MaxPoolGradV2
MaxPoolGradWithArgmax MaxPoolV2 MaxPoolWithArgmax Relu Relu6 Relu6Grad ReluGrad Selu SeluGrad Softmax
SoftmaxCrossEntropyWithLogits Softplus SoftplusGrad Softsign SoftsignGrad SparseSoftmaxCrossEntropyWithLogits
CudnnRNN CudnnRNNV2 CudnnRNNV3 CudnnRNNBackprop CudnnRNNBackpropV2 CudnnRNNBackpropV3 CudnnRNNParamsSize
CudnnRNNParamsToCanonical CudnnRNNParamsToCanonicalV2 CudnnRNNCanonicalToParams CudnnRNNCanonicalToParamsV2
FakeQuantWithMinMaxArgs FakeQuantWithMinMaxArgsGradient FakeQuantWithMinMaxVars FakeQuantWithMinMaxVarsGradient
FakeQuantWithMinMaxVarsPerChannel FakeQuantWithMinMaxVarsPerChannelGradient
AllCandidateSampler FixedUnigramCandidateSampler LearnedUnigramCandidateSampler LogUniformCandidateSampler
UniformCandidateSampler ThreadUnsafeUnigramCandidateSampler ComputeAccidentalHits NegTrain
"""

_ARRAY = """
BatchToSpace BatchToSpaceND BroadcastArgs BroadcastGradientArgs BroadcastTo CheckPinned Concat ConcatOffset
ConcatV2 DeepCopy DepthToSpace Diag DiagPart DynamicPartition DynamicStitch Empty EnsureShape ExpandDims
ExtractImagePatches ExtractVolumePatches Fill Gather GatherNd GatherV2 InplaceAdd InplaceSub InplaceUpdate
InvertPermutation MirrorPad MirrorPadGrad OneHot OnesLike Pack Pad PadV2 ParallelConcat ParallelDynamicStitch
Rank Reshape Reverse ReverseSequence ReverseV2 Roll ScatterNd ScatterNdNonAliasingAdd Shape ShapeN Size Slice
SpaceToBatch SpaceToBatchND SpaceToDepth Split SplitV Squeeze StridedSlice StridedSliceGrad TensorScatterAdd
TensorScatterMax TensorScatterMin TensorScatterSub TensorScatterUpdate TensorStridedSliceUpdate Tile TileGrad
Transpose UnravelIndex Unpack Where ZerosLike Snapshot Unbatch UnbatchGrad
"""

_CONTROL_FLOW = """
Switch Merge Enter Exit NextIteration LoopCond RefEnter RefExit RefMerge RefNextIteration RefSwitch RefSelect
ControlTrigger While StatelessWhile If StatelessIf Case StatelessCase For PartitionedCall
StatefulPartitionedCall SymbolicGradient FakeParam DeviceIndex
"""

_CONSTANTS_AND_FEEDS = """
Const HostConst Placeholder PlaceholderV2 PlaceholderWithDefault Identity IdentityN RefIdentity NoOp
StopGradient PreventGradient GuaranteeConst
"""

_STATE = """
Variable VariableV2 TemporaryVariable DestroyTemporaryVariable VarHandleOp ReadVariableOp AssignVariableOp
AssignAddVariableOp AssignSubVariableOp VarIsInitializedOp IsVariableInitialized VariableShape DestroyResourceOp
DisableCopyOnRead Assign AssignAdd AssignSub CountUpTo ResourceCountUpTo ResourceGather ResourceGatherNd
ResourceScatterAdd ResourceScatterDiv ResourceScatterMax ResourceScatterMin ResourceScatterMul
ResourceScatterNdAdd ResourceScatterNdMax ResourceScatterNdMin ResourceScatterNdSub ResourceScatterNdUpdate
ResourceScatterSub ResourceScatterUpdate ResourceStridedSliceAssign ScatterAdd ScatterDiv ScatterMax ScatterMin
ScatterMul ScatterNdAdd ScatterNdMax ScatterNdMin ScatterNdSub ScatterNdUpdate ScatterSub ScatterUpdate
StridedSliceAssign MutexV2 MutexLock ConsumeMutexLock
ApplyAdaMax ApplyAdadelta ApplyAdagrad ApplyAdagradDA ApplyAdagradV2 ApplyAdam ApplyAddSign ApplyCenteredRMSProp
ApplyFtrl ApplyFtrlV2 ApplyGradientDescent ApplyMomentum ApplyPowerSign ApplyProximalAdagrad
ApplyProximalGradientDescent ApplyRMSProp ResourceApplyAdaMax ResourceApplyAdadelta ResourceApplyAdagrad
ResourceApplyAdagradDA ResourceApplyAdagradV2 ResourceApplyAdam ResourceApplyAdamWithAmsgrad
ResourceApplyAddSign ResourceApplyCenteredRMSProp ResourceApplyFtrl ResourceApplyFtrlV2
ResourceApplyGradientDescent ResourceApplyKerasMomentum ResourceApplyMomentum ResourceApplyPowerSign
ResourceApplyProximalAdagrad ResourceApplyProximalGradientDescent ResourceApplyRMSProp ResourceSparseApplyAdadelta
ResourceSparseApplyAdagrad ResourceSparseApplyAdagradDA ResourceSparseApplyAdagradV2
ResourceSparseApplyCenteredRMSProp ResourceSparseApplyFtrl ResourceSparseApplyFtrlV2
ResourceSparseApplyKerasMomentum ResourceSparseApplyMomentum ResourceSparseApplyProximalAdagrad
ResourceSparseApplyProximalGradientDescent ResourceSparseApplyRMSProp SparseApplyAdadelta SparseApplyAdagrad
SparseApplyAdagradDA SparseApplyAdagradV2 SparseApplyCenteredRMSProp SparseApplyFtrl SparseApplyFtrlV2
SparseApplyMomentum SparseApplyProximalAdagrad SparseApplyProximalGradientDescent SparseApplyRMSProp
"""

_RANDOM = """
Multinomial ParameterizedTruncatedNormal RandomCrop RandomGamma RandomGammaGrad RandomIndexShuffle RandomPoisson
RandomPoissonV2 RandomShuffle RandomStandardNormal RandomUniform RandomUniformInt TruncatedNormal
StatefulRandomBinomial StatefulStandardNormal StatefulStandardNormalV2 StatefulTruncatedNormal StatefulUniform
StatefulUniformFullInt StatefulUniformInt StatelessMultinomial StatelessParameterizedTruncatedNormal
StatelessRandomBinomial StatelessRandomGammaV2 StatelessRandomGammaV3 StatelessRandomGetAlg
StatelessRandomGetKeyCounter StatelessRandomGetKeyCounterAlg StatelessRandomNormal StatelessRandomNormalV2
StatelessRandomPoisson StatelessRandomUniform StatelessRandomUniformFullInt StatelessRandomUniformFullIntV2
StatelessRandomUniformInt StatelessRandomUniformIntV2 StatelessRandomUniformV2 StatelessShuffle
StatelessTruncatedNormal StatelessTruncatedNormalV2 RngReadAndSkip RngSkip AnonymousRandomSeedGenerator
AnonymousSeedGenerator DeleteRandomSeedGenerator DeleteSeedGenerator DummySeedGenerator SobolSample
"""

_CONTAINERS = """
FIFOQueue FIFOQueueV2 PaddingFIFOQueue PaddingFIFOQueueV2 PriorityQueue PriorityQueueV2 RandomShuffleQueue
RandomShuffleQueueV2 QueueClose QueueCloseV2 QueueDequeue QueueDequeueMany QueueDequeueManyV2 QueueDequeueUpTo
QueueDequeueUpToV2 QueueDequeueV2 QueueEnqueue QueueEnqueueMany QueueEnqueueManyV2 QueueEnqueueV2 QueueIsClosed
QueueIsClosedV2 QueueSize QueueSizeV2 Stack StackClose StackCloseV2 StackPop StackPopV2 StackPush StackPushV2
StackV2 Stage StageClear StagePeek StageSize Unstage MapClear MapIncompleteSize MapPeek MapSize MapStage
MapUnstage MapUnstageNoKey OrderedMapClear OrderedMapIncompleteSize OrderedMapPeek OrderedMapSize OrderedMapStage
OrderedMapUnstage OrderedMapUnstageNoKey Barrier BarrierClose BarrierIncompleteSize BarrierInsertMany
BarrierReadySize BarrierTakeMany TensorArray TensorArrayClose TensorArrayCloseV2 TensorArrayCloseV3
TensorArrayConcat TensorArrayConcatV2 TensorArrayConcatV3 TensorArrayGather TensorArrayGatherV2
TensorArrayGatherV3 TensorArrayGrad TensorArrayGradV2 TensorArrayGradV3 TensorArrayGradWithShape TensorArrayPack
TensorArrayRead TensorArrayReadV2 TensorArrayReadV3 TensorArrayScatter TensorArrayScatterV2 TensorArrayScatterV3
TensorArraySize TensorArraySizeV2 TensorArraySizeV3 TensorArraySplit TensorArraySplitV2 TensorArraySplitV3
TensorArrayUnpack TensorArrayV2 TensorArrayV3 TensorArrayWrite TensorArrayWriteV2 TensorArrayWriteV3
EmptyTensorList TensorListConcat TensorListConcatLists TensorListConcatV2 TensorListElementShape
TensorListFromTensor TensorListGather TensorListGetItem TensorListLength TensorListPopBack TensorListPushBack
TensorListPushBackBatch TensorListReserve TensorListResize TensorListScatter TensorListScatterIntoExistingList
TensorListScatterV2 TensorListSetItem TensorListSplit TensorListStack EmptyTensorMap TensorMapErase
TensorMapHasKey TensorMapInsert TensorMapLookup TensorMapSize TensorMapStackKeys HashTable HashTableV2
AnonymousHashTable MutableHashTable MutableHashTableV2 MutableHashTableOfTensors MutableHashTableOfTensorsV2
MutableDenseHashTable MutableDenseHashTableV2 AnonymousMutableHashTable AnonymousMutableHashTableOfTensors
AnonymousMutableDenseHashTable InitializeTable InitializeTableV2 LookupTableFind LookupTableFindV2
LookupTableInsert LookupTableInsertV2 LookupTableRemoveV2 LookupTableSize LookupTableSizeV2 LookupTableExport
LookupTableExportV2 LookupTableImport LookupTableImportV2 ConditionalAccumulator SparseConditionalAccumulator
ResourceConditionalAccumulator AccumulatorApplyGradient AccumulatorNumAccumulated AccumulatorSetGlobalStep
AccumulatorTakeGradient SparseAccumulatorApplyGradient SparseAccumulatorTakeGradient
ResourceAccumulatorApplyGradient ResourceAccumulatorNumAccumulated ResourceAccumulatorSetGlobalStep
ResourceAccumulatorTakeGradient OptionalFromValue OptionalGetValue OptionalHasValue OptionalNone
"""

_STRINGS_SPARSE = """
AsString DecodeBase64 EncodeBase64 DecodeCSV DecodeRaw DecodePaddedRaw DecodeCompressed DecodeJSONExample
Fingerprint ParseExample ParseExampleV2 ParseSequenceExample ParseSequenceExampleV2 ParseSingleExample
ParseSingleSequenceExample ParseTensor SerializeTensor ReduceJoin RegexFullMatch RegexReplace StaticRegexFullMatch
StaticRegexReplace StringFormat StringJoin StringLength StringLower StringNGrams StringSplit StringSplitV2
StringStrip StringToHashBucket StringToHashBucketFast StringToHashBucketStrong StringToNumber StringUpper Substr
UnicodeDecode UnicodeDecodeWithOffsets UnicodeEncode UnicodeScript UnicodeTranscode UnsortedSegmentJoin
EditDistance AddManySparseToTensorsMap AddSparseToTensorsMap TakeManySparseFromTensorsMap DeserializeManySparse
DeserializeSparse SerializeManySparse SerializeSparse SparseAdd SparseAddGrad SparseConcat SparseCross
SparseCrossHashed SparseCrossV2 SparseDenseCwiseAdd SparseDenseCwiseDiv SparseDenseCwiseMul SparseFillEmptyRows
SparseFillEmptyRowsGrad SparseReduceMax SparseReduceMaxSparse SparseReduceSum SparseReduceSumSparse SparseReorder
SparseReshape SparseSegmentMean SparseSegmentMeanGrad SparseSegmentMeanGradV2 SparseSegmentMeanWithNumSegments
SparseSegmentSqrtN SparseSegmentSqrtNGrad SparseSegmentSqrtNGradV2 SparseSegmentSqrtNWithNumSegments
SparseSegmentSum SparseSegmentSumGrad SparseSegmentSumGradV2 SparseSegmentSumWithNumSegments SparseSlice
SparseSliceGrad SparseSoftmax SparseSparseMaximum SparseSparseMinimum SparseSplit SparseTensorDenseAdd
SparseTensorDenseMatMul SparseToDense SparseToSparseSetOperation DenseToSparseSetOperation SparseBincount
SparseCountSparseOutput DenseCountSparseOutput RaggedBincount RaggedCountSparseOutput RaggedCross
RaggedFillEmptyRows RaggedFillEmptyRowsGrad RaggedGather RaggedRange RaggedTensorFromVariant RaggedTensorToSparse
RaggedTensorToTensor RaggedTensorToVariant RaggedTensorToVariantGradient
"""

_IMAGE = """
AdjustContrast AdjustContrastv2 AdjustHue AdjustSaturation CropAndResize CropAndResizeGradBoxes
CropAndResizeGradImage DecodeAndCropJpeg DecodeBmp DecodeGif DecodeImage DecodeJpeg DecodePng DecodeWebP
DrawBoundingBoxes DrawBoundingBoxesV2 EncodeJpeg EncodeJpegVariableQuality EncodePng ExtractGlimpse
ExtractGlimpseV2 ExtractJpegShape HSVToRGB RGBToHSV ImageProjectiveTransformV2 ImageProjectiveTransformV3
NonMaxSuppression NonMaxSuppressionV2 NonMaxSuppressionV3 NonMaxSuppressionV4 NonMaxSuppressionV5
NonMaxSuppressionWithOverlaps CombinedNonMaxSuppression ResizeArea ResizeBicubic ResizeBicubicGrad ResizeBilinear
ResizeBilinearGrad ResizeNearestNeighbor ResizeNearestNeighborGrad SampleDistortedBoundingBox
SampleDistortedBoundingBoxV2 StatelessSampleDistortedBoundingBox ScaleAndTranslate ScaleAndTranslateGrad
DecodeWav EncodeWav AudioSpectrogram Mfcc
"""

_CHECKS = """
Assert CheckNumerics CheckNumericsV2
"""

FAMILIES: dict[str, frozenset[str]] = {
    name: frozenset(text.split())
    for name, text in [
        ("arithmetic", _ARITHMETIC), ("nn", _NN), ("array", _ARRAY), ("control_flow", _CONTROL_FLOW),
        ("constants_and_feeds", _CONSTANTS_AND_FEEDS), ("state", _STATE), ("random", _RANDOM),
        ("containers", _CONTAINERS), ("strings_sparse", _STRINGS_SPARSE), ("image", _IMAGE), ("checks", _CHECKS),
    ]
}
SAFE_OPS: frozenset[str] = frozenset().union(*FAMILIES.values())

# Never allowed without --allow-unsafe-ops, and named here so a reviewer sees they were considered.
KNOWN_UNSAFE: dict[str, str] = {
    "ReadFile": "reads any file", "WriteFile": "writes any file", "MatchingFiles": "lists the file system",
    "Save": "writes checkpoints", "SaveV2": "writes checkpoints", "SaveSlices": "writes checkpoints",
    "Restore": "reads checkpoints", "RestoreV2": "reads checkpoints", "RestoreSlice": "reads checkpoints",
    "MergeV2Checkpoints": "moves/deletes files", "ImmutableConst": "memory-maps a file",
    "InitializeTableFromTextFile": "reads a file", "InitializeTableFromTextFileV2": "reads a file",
    "LoadAndRemapMatrix": "reads checkpoints", "PyFunc": "runs Python", "PyFuncStateless": "runs Python",
    "EagerPyFunc": "runs Python", "Print": "writes to the worker's log", "PrintV2": "can write to a file",
    "DebugIdentity": "can write to file:// or grpc:// URLs", "DebugIdentityV2": "writes debug event files",
    "Send": "cross-process rendezvous", "Recv": "cross-process rendezvous", "RemoteCall": "calls another task",
    "WriteSummary": "writes event files", "CreateSummaryFileWriter": "writes event files",
    "TFRecordReader": "reads files", "TFRecordReaderV2": "reads files", "WholeFileReader": "reads files",
    "WholeFileReaderV2": "reads files", "TextLineReader": "reads files", "TextLineReaderV2": "reads files",
    "DecodeProtoV2": "may load a descriptor file", "EncodeProto": "may load a descriptor file",
}


@dataclass
class UnsafeOp:
    node: str
    op: str
    function: str | None = None   # the library function holding the node, None at top level

    def describe(self) -> str:
        where = f" in function {self.function!r}" if self.function else ""
        why = KNOWN_UNSAFE.get(self.op, "not in the reviewed allowlist of in-memory ops")
        return f"op {self.op} (node {self.node!r}{where}: {why})"


class UnsafeGraphError(PlacerError):
    """A graph holds an op outside the allowlist."""


def unsafe_ops(graph_def) -> list[UnsafeOp]:
    """Every node (top level and inside function-library bodies) whose op type is neither allowlisted nor a
    function of the graph's own library.

    >>> from tensorflow.core.framework import graph_pb2
    >>> gd = graph_pb2.GraphDef(); n = gd.node.add(name="w", op="WriteFile")
    >>> [u.op for u in unsafe_ops(gd)]
    ['WriteFile']
    """
    lib = {f.signature.name for f in graph_def.library.function}
    bad = [UnsafeOp(n.name, n.op) for n in graph_def.node if n.op not in SAFE_OPS and n.op not in lib]
    for f in graph_def.library.function:
        for n in f.node_def:
            if n.op not in SAFE_OPS and n.op not in lib:
                bad.append(UnsafeOp(n.name, n.op, f.signature.name))
    return bad


def check_graph(graph_def) -> None:
    """Raise UnsafeGraphError naming the first few unsafe ops (and how to accept them)."""
    bad = unsafe_ops(graph_def)
    if bad:
        kinds = sorted({b.op for b in bad})
        raise UnsafeGraphError(
            f"graph refused: it holds {len(bad)} op(s) outside the worker's safe allowlist "
            f"({', '.join(kinds[:8])}); first: {bad[0].describe()}. Start the worker with --allow-unsafe-ops "
            "only if you trust every client")
