/// Hands a target's `main` to libFuzzer's driver. SwiftPM links an executable's `main` to `<module>_main`, so each
/// target defines that symbol and calls this with its `LLVMFuzzerTestOneInput`.
public func runFuzzer(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?,
                      _ testOneInput: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Int32 {
    var count = argc
    var arguments = argv
    return LLVMFuzzerRunDriver(&count, &arguments, testOneInput)
}

@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(_ argc: UnsafeMutablePointer<Int32>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                         _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> Int32) -> Int32
