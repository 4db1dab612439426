import FuzzDriver
import ProtectedStoreFuzzing

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>?, _ count: Int) -> Int32 {
    FuzzHarness.names(data.map { Array(UnsafeBufferPointer(start: $0, count: count)) } ?? [])
    return 0
}

@_cdecl("FuzzNames_main")
public func fuzzMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 { runFuzzer(argc, argv, fuzz) }
